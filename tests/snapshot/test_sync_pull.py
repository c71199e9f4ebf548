"""The parallel, verifying pull: ranged GETs into the local tier, hashed as parts land.

A real SeaweedFS behind ``tests/helpers/fault_proxy.py``: the proxy's log shows which GETs were
made (ranged parts of one blob), and its faults cut or garble single parts. What landed is
checked directly in the local tier: every blob verified, a snapshot complete or absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from burst.errors import BurstError, SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, sync
from burst.snapshot import tiers as snapshot
from burst.snapshot.tensors import load_tensors, pull_tensors
from burst.store import LocalStore, MemoryStore, open_store
from burst.store.retry import RetryPolicy
from burst.store.s3 import S3Store
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.store_servers import S3Server

RUN = "pull"
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05)
PART = 1 << 20  # small parts keep the test quick; the code path is the same as 8 MiB ones
BIG = (PART + PART // 2) // 4  # float32s: one blob of one and a half parts


@pytest.fixture
def proxy(seaweed_proxy: tuple[FaultProxy, str]) -> tuple[FaultProxy, str]:
    return seaweed_proxy  # tests/helpers/store_servers.py: SeaweedFS behind a fresh fault proxy


def tensors(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"big": torch.randn(BIG, generator=g), "small": torch.arange(10.0) * step}


@pytest.fixture
def uploaded(seaweed: S3Server, proxy, tmp_path: Path) -> str:
    """Steps 1 and 2 in the store (written directly, not through the proxy)."""
    url = seaweed.url()
    local = LocalStore(tmp_path / "src")
    for step in (1, 2):
        snapshot.write_snapshot(local, RUN, snapshot.Captured(step, {}, tensors(step),
                                                              {"reason": "periodic"}))
    sync.push(local, open_store(url, **seaweed.options()), RUN, every=True)
    return url


def through(endpoint: str, url: str) -> S3Store:
    store = open_store(url, endpoint_url=endpoint, addressing_style="path", region="us-east-1")
    assert isinstance(store, S3Store)
    store.get_part_size = PART
    return store


def big_blob(store: S3Store, step: int) -> str:
    manifest = reader.read_manifest(store, RUN, step)
    assert manifest is not None
    return manifest["tensors"]["big"]["blob"]


def gets_of(faults: FaultProxy, digest: str) -> int:
    return sum(1 for method, path, _ in faults.log if method == "GET" and digest in path)


def test_a_blob_bigger_than_a_part_comes_down_as_ranged_parts_intact(proxy, uploaded,
                                                                     tmp_path: Path) -> None:
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    digest = big_blob(remote, 2)
    local = LocalStore(tmp_path / "dst")
    transfer = sync.pull(remote, local, RUN, policy=FAST)
    assert transfer.step == 2 and transfer.blobs_sent == 2
    assert gets_of(faults, digest) == 2  # two ranged GETs, no HEAD-then-GET of the whole
    loaded = load_tensors(local, reader.read_manifest(local, RUN))
    assert all(torch.equal(loaded[k], v) for k, v in tensors(2).items())


def test_a_cut_off_part_is_fetched_again_alone(proxy, uploaded, tmp_path: Path) -> None:
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    digest = big_blob(remote, 2)
    faults.add("truncate", "GET", digest, times=1)
    local = LocalStore(tmp_path / "dst")
    transfer = sync.pull(remote, local, RUN, policy=FAST)
    assert faults.fired("truncate") == 1
    assert transfer.step == 2 and not transfer.fallbacks
    assert gets_of(faults, digest) == 3  # two parts, one of them twice: not the whole blob
    reader.verify(local, RUN, 2)


def test_a_blob_corrupted_in_the_store_is_refused(proxy, uploaded, seaweed,
                                                  tmp_path: Path) -> None:
    """Same size, other bytes, at rest: the hash check refuses it before it is visible."""
    _, endpoint = proxy
    remote = through(endpoint, uploaded)
    digest = big_blob(remote, 2)
    key = fmt.blob_key(RUN, digest)
    direct = open_store(uploaded, **seaweed.options())
    data = bytearray(direct.get(key))
    data[-1] ^= 0xFF  # in the last part: the first one has been hashed by then
    direct.put(key, data)
    local = LocalStore(tmp_path / "dst")
    transfer = sync.pull(remote, local, RUN, policy=FAST)
    assert transfer.step == 1 and "corrupt" in transfer.fallbacks[0]
    assert not local.size(key)  # never renamed into the local tier
    assert reader.list_steps(local, RUN) == [1]
    assert not list((tmp_path / "dst").rglob(".*.tmp"))


def test_a_blob_of_the_wrong_size_in_the_store_is_refused(proxy, uploaded, seaweed,
                                                         tmp_path: Path) -> None:
    """No HEAD is made: the parts' Content-Range gives the size away."""
    _, endpoint = proxy
    remote = through(endpoint, uploaded)
    key = fmt.blob_key(RUN, big_blob(remote, 2))
    direct = open_store(uploaded, **seaweed.options())
    direct.put(key, direct.get(key) + b"\0" * 4096)
    local = LocalStore(tmp_path / "dst")
    transfer = sync.pull(remote, local, RUN, policy=FAST)
    assert transfer.step == 1 and "bytes expected" in transfer.fallbacks[0]
    assert not local.size(key)


def test_a_part_that_keeps_failing_leaves_nothing_in_the_local_tier(proxy, uploaded,
                                                                   tmp_path: Path) -> None:
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    for step in (1, 2):
        faults.add("reset-response", "GET", big_blob(remote, step), times=None)
    local = LocalStore(tmp_path / "dst")
    with pytest.raises(BurstError) as caught:
        sync.pull(remote, local, RUN, policy=FAST)
    assert "\n" not in str(caught.value)
    assert reader.list_steps(local, RUN) == []
    assert not list((tmp_path / "dst").rglob(".*.tmp"))  # no half-written temporary left


def test_a_pull_into_a_store_that_is_not_local_verifies_the_parts_too(proxy, uploaded,
                                                                      tmp_path: Path) -> None:
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    faults.add("corrupt", "GET", big_blob(remote, 2), times=None)
    memory = MemoryStore(tmp_path.name)
    transfer = sync.pull(remote, memory, RUN, policy=FAST)
    assert transfer.step == 1 and "corrupt" in transfer.fallbacks[0]
    with pytest.raises(SnapshotError):
        reader.read_manifest_bytes(memory, RUN, 2)
    reader.verify(memory, RUN, 1)


def test_a_pull_for_a_resume_hands_back_the_tensors_it_verified_in_memory(proxy, uploaded,
                                                                          tmp_path: Path) -> None:
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    faults.add("corrupt", "GET", big_blob(remote, 2), times=None)  # falls back to step 1
    local = LocalStore(tmp_path / "dst")
    transfer, manifest, loaded = pull_tensors(remote, local, RUN, policy=FAST)
    assert transfer.step == manifest["step"] == 1 and transfer.fallbacks
    assert all(torch.equal(loaded[k], v) for k, v in tensors(1).items())
    reader.verify(local, RUN, 1)  # the local tier got the same verified bytes
    assert reader.list_steps(local, RUN) == [1]

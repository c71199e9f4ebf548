"""Storage faults: a broken network in front of a real S3 server, and a full disk.

Every transfer runs through ``tests/helpers/fault_proxy.py`` in front of SeaweedFS. Whatever the
fault, a push or pull either finishes with every byte right (checked directly against
the server, not through the proxy) or fails with a one-line ``BurstError``; a manifest is
never committed for a snapshot whose blobs are not all there and intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from burst.cli import main as cli_main
from burst.env import lockfile, wheelhouse
from burst.env.lockfile import Package
from burst.errors import BurstError, SnapshotError
from burst.snapshot import reader, sync
from burst.snapshot import tiers as snapshot
from burst.store import LocalStore, open_store
from burst.store.retry import RetryPolicy
from burst.store.s3 import S3Store
from tests.helpers.env_helpers import build_wheel, tiny_lockfile
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.store_servers import S3Server, aws_env

RUN = "faulty"
FAST = RetryPolicy(attempts=6, base=0.05, cap=0.3)
BIG = 3 * 1024 * 1024  # 12 MiB of float32: three 5 MiB multipart parts (the last short)
BLOBS = r"/blobs/"
MANIFESTS = r"/snapshots/\d+\.json"


@pytest.fixture
def proxy(seaweed_proxy: tuple[FaultProxy, str]) -> tuple[FaultProxy, str]:
    return seaweed_proxy  # tests/helpers/store_servers.py: SeaweedFS behind a fresh fault proxy


def captured(step: int) -> snapshot.Captured:
    tensors = {"big": torch.full((BIG,), float(step)), "small": torch.arange(10.0) * step}
    tree = {"model": {name: {"$tensor": name} for name in tensors}}
    return snapshot.Captured(step, tree, tensors, {"reason": "periodic"})


def local_run(root: Path, steps: tuple[int, ...] = (1, 2)) -> LocalStore:
    store = LocalStore(root)
    for step in steps:
        snapshot.write_snapshot(store, RUN, captured(step))
    return store


def through(endpoint: str, url: str) -> S3Store:
    store = open_store(url, endpoint_url=endpoint, addressing_style="path", region="us-east-1",
                       part_size=5 << 20)
    assert isinstance(store, S3Store)
    return store


def direct(seaweed: S3Server, url: str) -> S3Store:
    store = open_store(url, **seaweed.options(region="us-east-1"))
    assert isinstance(store, S3Store)
    return store


def assert_only_complete(store: object) -> list[int]:
    """Every snapshot the store lists verifies (manifest, each blob's size and hash)."""
    steps = reader.list_steps(store, RUN)  # type: ignore[arg-type]
    for step in steps:
        reader.verify(store, RUN, step)  # type: ignore[arg-type]
    return steps


# -- uploads ---------------------------------------------------------------------------


def test_push_rides_out_5xx_bursts_and_throttling(proxy, seaweed, tmp_path: Path) -> None:
    faults, endpoint = proxy
    url = seaweed.url()
    faults.add("500", "PUT", BLOBS, times=3)
    faults.add("slowdown", ".*", ".*", times=4)
    faults.add("503", "HEAD", BLOBS, times=2)
    sync.push(local_run(tmp_path), through(endpoint, url), RUN, every=True, policy=FAST)
    assert faults.fired() == 9
    assert assert_only_complete(direct(seaweed, url)) == [1, 2]


def test_push_rides_out_resets_mid_body(proxy, seaweed, tmp_path: Path) -> None:
    faults, endpoint = proxy
    url = seaweed.url()
    faults.add("reset-request", "PUT", r"partNumber=2", times=2)  # a multipart part
    faults.add("reset-request", "PUT", r"/blobs/.*[^?]$", times=1)
    faults.add("drop-response", "PUT", MANIFESTS, times=1)  # applied, answer lost
    transfers = sync.push(local_run(tmp_path), through(endpoint, url), RUN, every=True,
                          policy=FAST)
    assert faults.fired("reset-request") == 3 and faults.fired("drop-response") == 1
    assert [t.step for t in transfers] == [1, 2]
    assert assert_only_complete(direct(seaweed, url)) == [1, 2]


def test_push_that_keeps_failing_is_loud_and_commits_nothing(proxy, seaweed,
                                                             tmp_path: Path) -> None:
    faults, endpoint = proxy
    url = seaweed.url()
    local = local_run(tmp_path, (1,))
    faults.add("500", "PUT", r"partNumber=3", times=None)  # the big blob never lands
    with pytest.raises(BurstError) as caught:
        sync.push(local, through(endpoint, url), RUN, policy=FAST)
    assert "\n" not in str(caught.value) and "InternalError" in str(caught.value)
    remote = direct(seaweed, url)
    assert reader.list_steps(remote, RUN) == []  # no manifest for a half-uploaded snapshot
    faults.clear()
    sync.push(local, through(endpoint, url), RUN, policy=FAST)  # the retry completes it
    assert assert_only_complete(remote) == [1]


def test_a_blob_the_server_drops_is_never_committed(proxy, seaweed, tmp_path: Path) -> None:
    """A server that answers 200 and stores nothing (or less) is caught by the size check."""
    faults, endpoint = proxy
    url = seaweed.url()
    local = local_run(tmp_path, (1,))
    small = next(k for k in local.list(f"{RUN}/blobs/") if local.size(k) < BIG)
    faults.add("lie", "PUT", small.rsplit("/", 1)[1] + "$", times=None)
    with pytest.raises(BurstError) as caught:
        sync.push(local, through(endpoint, url), RUN, policy=FAST)
    assert "landed" in str(caught.value)
    assert reader.list_steps(direct(seaweed, url), RUN) == []


def test_slow_bodies_finish_intact_both_ways(proxy, seaweed, tmp_path: Path) -> None:
    faults, endpoint = proxy
    url = seaweed.url()
    faults.add("slow", "PUT", r"partNumber=1", times=1)
    faults.add("slow", "GET", BLOBS, times=2)
    sync.push(local_run(tmp_path / "a", (1,)), through(endpoint, url), RUN, policy=FAST)
    pulled = LocalStore(tmp_path / "b")
    sync.pull(through(endpoint, url), pulled, RUN, policy=FAST)
    assert faults.fired("slow") == 3
    assert assert_only_complete(pulled) == [1]


# -- downloads -------------------------------------------------------------------------


@pytest.fixture
def uploaded(seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    aws_env(monkeypatch)
    url = seaweed.url()
    sync.push(local_run(tmp_path / "src"), direct(seaweed, url), RUN, every=True)
    return url


def test_pull_rides_out_truncated_and_reset_bodies(proxy, uploaded, tmp_path: Path) -> None:
    faults, endpoint = proxy
    faults.add("truncate", "GET", BLOBS, times=2)
    faults.add("reset-response", "GET", BLOBS, times=1)
    faults.add("truncate", "GET", MANIFESTS, times=1)
    faults.add("truncate", "GET", r"list-type=2", times=1)
    local = LocalStore(tmp_path / "dst")
    transfer = sync.pull(through(endpoint, uploaded), local, RUN, policy=FAST)
    assert faults.fired() == 5
    assert transfer.step == 2 and not transfer.fallbacks  # transient: retried, not skipped
    assert assert_only_complete(local) == [2]


def test_pull_retries_truncated_reads_of_the_run_files(proxy, uploaded, seaweed,
                                                      tmp_path: Path) -> None:
    """The lockfile and code archive are read through the retry policy too: a truncated
    GET of one must not fail a pull whose snapshot already landed."""
    faults, endpoint = proxy
    files = {f"{RUN}/env/lockfile.json": os.urandom(8192), f"{RUN}/code/code.tar": os.urandom(8192)}
    for key, data in files.items():
        direct(seaweed, uploaded).put(key, data)
    faults.add("truncate", "GET", r"/env/lockfile\.json$", times=1)
    faults.add("truncate", "GET", r"/code/code\.tar$", times=1)
    local = LocalStore(tmp_path / "dst")
    sync.pull(through(endpoint, uploaded), local, RUN, policy=FAST)
    assert faults.fired("truncate") == 2
    assert {key: local.get(key) for key in files} == files


def test_corrupt_download_is_refused_and_falls_back(proxy, uploaded, tmp_path: Path) -> None:
    """Bytes flipped in flight fail the hash check; pull never commits that snapshot."""
    faults, endpoint = proxy
    remote = through(endpoint, uploaded)
    newest = reader.read_manifest(remote, RUN)
    assert newest is not None
    changed = [d for d in newest["blobs"] if newest["blobs"][d]["size"] >= BIG * 4]
    faults.add("corrupt", "GET", changed[0], times=None)
    local = LocalStore(tmp_path / "dst")
    warnings: list[str] = []
    transfer = sync.pull(remote, local, RUN, policy=FAST, log=warnings.append)
    assert transfer.step == 1 and "corrupt" in transfer.fallbacks[0]
    assert warnings and "falling back to step 1" in warnings[0]
    assert assert_only_complete(local) == [1]


def test_corrupt_manifest_in_flight_is_refused(proxy, uploaded, tmp_path: Path) -> None:
    faults, endpoint = proxy
    faults.add("corrupt", "GET", MANIFESTS, times=None)
    with pytest.raises(BurstError) as caught:
        sync.pull(through(endpoint, uploaded), LocalStore(tmp_path / "dst"), RUN, policy=FAST)
    assert "\n" not in str(caught.value)
    assert reader.list_steps(LocalStore(tmp_path / "dst"), RUN) == []


# -- a full disk -----------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[str]:
    """A tmpfs of ``size`` at ``path`` if this machine lets us mount one, else nothing."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, check=False).returncode == 0
    try:
        yield "tmpfs" if mounted else "none"
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=False)


class FullDisk(LocalStore):
    """Fallback where mounting is not allowed: ENOSPC once ``budget`` bytes are written."""

    def __init__(self, root: Path, budget: int) -> None:
        super().__init__(root)
        self.budget = budget

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self.budget -= len(memoryview(data).cast("B"))
        if self.budget < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().put(key, data)


def test_disk_full_during_persist_keeps_the_previous_snapshot(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "20m") as how:
        print(f"\ndisk full simulated with: {how if how != 'none' else 'a store raising ENOSPC'}")
        root = tmp_path / "disk" / "store"
        store = LocalStore(root) if how == "tmpfs" else FullDisk(root, 20 << 20)
        tiers = snapshot.Tiers(store, RUN, keep=3)
        tiers.persist(captured(1))
        tiers.flush()
        with pytest.warns(RuntimeWarning, match="step 2 could not be written.*No space left"):
            tiers.persist(captured(2))  # 12 MiB more does not fit in what is left
            with pytest.raises(SnapshotError) as caught:
                tiers.flush()
        message = str(caught.value)
        assert "No space left on device" in message and "\n" not in message
        assert assert_only_complete(store) == [1]
        assert not [p for p in root.rglob(".*.tmp")]  # no half-written temporary left


# -- the wheelhouse step of burst push ---------------------------------------------------


def test_push_rides_out_truncated_reads_and_failed_writes_in_its_wheelhouse_step(
        proxy, seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the snapshots, burst push stores the run's wheelhouse: its reads and writes
    go through the retry policy too, so one truncated body does not fail a complete push."""
    faults, endpoint = proxy
    links = tmp_path / "links"
    build_wheel(links, "burst-fault-dep", "1.0.0", "VALUE = 1\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv(wheelhouse.CACHE_ENV, str(tmp_path / "wheel-cache"))
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    local = local_run(tmp_path / "local", (1,))
    lockfile.save(local, RUN, tiny_lockfile(Package("burst-fault-dep", "1.0.0")))
    faults.add("truncate", "GET", r"/env/lockfile\.json$", times=1)
    faults.add("truncate", "GET", r"list-type=2&prefix=.*env%2Fwheelhouse-", times=1)
    faults.add("500", "PUT", r"/wheels/", times=2)
    url = seaweed.url()
    result = CliRunner().invoke(cli_main, [
        "push", RUN, "--store", url, "--local", str(local.root), "--endpoint-url", endpoint,
        "--region", "us-east-1", "--wheels", "no-torch"])
    assert result.exit_code == 0, result.output
    assert faults.fired("truncate") == 2 and faults.fired("500") == 2
    remote = direct(seaweed, url)
    index = wheelhouse.load_index(remote, RUN, lockfile.load(remote, RUN).digest)
    assert index is not None and "burst-fault-dep" in {w["name"] for w in index["wheels"]}


def test_a_body_cut_short_every_time_is_said_as_a_broken_connection_not_an_unreachable_endpoint(
        proxy, seaweed, tmp_path: Path) -> None:
    faults, endpoint = proxy
    url = seaweed.url()
    remote = through(endpoint, url)
    direct(seaweed, url).put(f"{RUN}/env/lockfile.json", os.urandom(4096))
    faults.add("truncate", "GET", r"/env/lockfile\.json$", times=None)
    with pytest.raises(BurstError) as caught:
        sync.copy_extras(remote, LocalStore(tmp_path / "dst"), RUN, FAST)
    message = str(caught.value)
    assert "the connection broke while reading" in message and "cannot reach" not in message
    assert faults.fired("truncate") == FAST.attempts  # retried, then said in one line

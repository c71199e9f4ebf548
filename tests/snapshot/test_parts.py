"""Sharded snapshots written part by part (burst.snapshot.parts, Tiers.shard_into), against
a real S3 server: ranks are threads (or a real process, to be killed) on one store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, retention, shards
from burst.snapshot import tiers as tiers_mod
from burst.snapshot.parts import Box, commit_parts, write_part
from burst.snapshot.tiers import Captured, Tiers, write_snapshot
from burst.store import open_store
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, aws_env

RUN = "run"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    url = moto_s3.url()
    return open_store(url, **moto_s3.options())


def full_state(step: int) -> dict[str, torch.Tensor]:
    """A step's whole tensors: a big matrix (over one chunk) and a small bias."""
    gen = torch.Generator().manual_seed(step)  # its own: ranks are threads
    return {"state/model/w": torch.randn(2400, 1000, generator=gen),
            "state/model/b": torch.randn(7, generator=gen),
            "state/extra/n": torch.tensor(step)}


TREE = {"model": {"w": {"$tensor": "state/model/w"}, "b": {"$tensor": "state/model/b"}},
        "extra": {"n": {"$tensor": "state/extra/n"}}}


def pieces(step: int, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, Box]]:
    """Rank 0 holds rows 0..1399 of w and the extra; rank 1 rows 1400.. and the bias."""
    full = full_state(step)
    w = full["state/model/w"]
    if rank == 0:
        return ({"state/model/w": w[:1400].clone(), "state/extra/n": full["state/extra/n"]},
                {"state/model/w": Box((2400, 1000), (0, 0)),
                 "state/extra/n": Box((), ())})
    return ({"state/model/w": w[1400:].clone(), "state/model/b": full["state/model/b"]},
            {"state/model/w": Box((2400, 1000), (1400, 0)), "state/model/b": Box((7,), (0,))})


def write(store, step: int, rank: int, **kw) -> dict:
    tensors, boxes = pieces(step, rank)
    return write_part(store, RUN, step, rank, tensors, boxes, world_size=2, **kw)


def snapshot(store, step: int, timeout: float = 30.0, **kw) -> dict | None:
    """Both ranks write their parts side by side while rank 0 waits to commit."""
    other = threading.Thread(target=write, args=(store, step, 1), kwargs=kw)
    other.start()
    try:
        write(store, step, 0, **kw)
        return commit_parts(store, RUN, step, 2, tree=TREE, meta={"reason": "periodic"},
                            timeout=timeout, **kw)
    finally:
        other.join()


def test_merged_parts_commit_a_manifest_that_reads_back_whole(s3):
    manifest = snapshot(s3, 5)
    stored = reader.read_manifest(s3, RUN, 5)
    assert stored == manifest and stored["format"] == fmt.SHARDED_FORMAT_VERSION
    assert len(stored["tensors"]["state/model/w"]["shards"]) == 2
    for name, tensor in full_state(5).items():
        assert torch.equal(shards.read_whole(s3, stored, name), tensor), name


def test_rank_0_commits_its_own_part_from_memory_without_storing_it(s3):
    other = threading.Thread(target=write, args=(s3, 5, 1))
    other.start()
    try:
        own = write(s3, 5, 0, publish=False)
        manifest = commit_parts(s3, RUN, 5, 2, tree=TREE, meta={"reason": "periodic"},
                                timeout=30, own=own)
    finally:
        other.join()
    assert s3.list(f"{RUN}/parts/") == [fmt.part_key(RUN, 5, 1)]
    stored = reader.read_manifest(s3, RUN, 5)
    assert stored == manifest
    for name, tensor in full_state(5).items():
        assert torch.equal(shards.read_whole(s3, stored, name), tensor), name


def test_a_commit_deletes_the_parts_and_markers_of_older_steps_and_keeps_its_own(s3):
    snapshot(s3, 5)
    snapshot(s3, 6)
    assert s3.list(f"{RUN}/parts/") == [fmt.part_key(RUN, 6, 0), fmt.part_key(RUN, 6, 1)]
    assert all(".r" in key and "000000000006" in key for key in s3.list(f"{RUN}/uploads/"))


def test_a_step_persisted_again_after_the_other_rank_rewrote_its_part_commits(s3):
    """The final snapshot at the step of a periodic one: rank 1 rewrites its part while
    rank 0 is still committing the first; rank 0's second commit finds it."""
    write(s3, 5, 1)  # the periodic snapshot of step 5
    write(s3, 5, 0)
    write(s3, 5, 1)  # rank 1 is done with it and writes the final one before rank 0 commits
    commit_parts(s3, RUN, 5, 2, tree=TREE, meta={"reason": "periodic"}, timeout=5)
    write(s3, 5, 0)
    manifest = commit_parts(s3, RUN, 5, 2, tree=TREE, meta={"reason": "final"}, timeout=5)
    assert manifest is not None and reader.read_manifest(s3, RUN, 5)["reason"] == "final"


def test_blobs_over_one_chunk_carry_chunk_hashes(s3):
    manifest = snapshot(s3, 5)
    big = manifest["tensors"]["state/model/w"]["shards"][0]["blob"]
    assert len(manifest["blobs"][big]["chunks"]) == -(-1400 * 1000 * 4 // fmt.CHUNK_BYTES)


def test_a_rank_killed_mid_part_leaves_no_manifest_and_the_previous_snapshot(s3, moto_s3):
    snapshot(s3, 1)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RANK, s3.url, moto_s3.endpoint], cwd=ROOT,
        env={**os.environ, "BURST_KILLPOINT": "2", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
             "AWS_SECRET_ACCESS_KEY": SECRET_KEY}, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    write(s3, 2, 0)
    with pytest.raises(SnapshotError, match="rank\\(s\\) 1 did not report"):
        commit_parts(s3, RUN, 2, 2, tree=TREE, meta={"reason": "periodic"}, timeout=1.0)
    assert reader.list_steps(s3, RUN) == [1]
    previous = reader.read_manifest(s3, RUN, 1)
    assert torch.equal(shards.read_whole(s3, previous, "state/model/w"),
                       full_state(1)["state/model/w"])


# rank 1 in its own process, SIGKILLed at its second kill point: its marker is in, and it
# is about to land its first blob
KILLED_RANK = """
import sys, torch
from burst.snapshot.parts import Box, write_part
from burst.store import open_store
store = open_store(sys.argv[1], endpoint_url=sys.argv[2], addressing_style="path")
write_part(store, "run", 2, 1, {"state/model/b": torch.ones(7)}, {"state/model/b": Box((7,), (0,))},
           world_size=2)
"""


def test_a_step_a_rank_skipped_is_given_up_and_the_next_commits(s3):
    write(s3, 3, 1)  # rank 1 coalesced step 2 into step 3
    write(s3, 2, 0)
    assert commit_parts(s3, RUN, 2, 2, tree=TREE, meta={}, timeout=30) is None
    assert reader.list_steps(s3, RUN) == []
    assert s3.list(fmt.parts_prefix(RUN, 2)) == []
    write(s3, 3, 0)
    assert commit_parts(s3, RUN, 3, 2, tree=TREE, meta={}, timeout=30) is not None
    assert reader.list_steps(s3, RUN) == [3]


def test_parts_of_another_launch_are_not_merged(s3):
    write(s3, 4, 1, launch="old")  # an earlier launch died after this part
    write(s3, 4, 0, launch="new")
    with pytest.raises(SnapshotError, match="did not report"):
        commit_parts(s3, RUN, 4, 2, tree=TREE, meta={}, launch="new", timeout=0.5)
    write(s3, 4, 1, launch="new")
    manifest = commit_parts(s3, RUN, 4, 2, tree=TREE, meta={}, launch="new", timeout=30)
    assert manifest is not None


def test_rank_markers_keep_a_parts_blobs_from_gc_until_the_commit(s3):
    snapshot(s3, 1)
    snapshot(s3, 2)
    report = write(s3, 3, 1)  # in flight: rank 0 has not committed step 3 yet
    gc = retention.gc(s3, RUN, keep_last=1)
    assert gc.dropped == [1] and gc.protected_in_flight >= 1
    for digest, info in report["blobs"].items():
        assert s3.size(fmt.blob_key(RUN, digest)) == info["size"]
    write(s3, 3, 0)
    assert commit_parts(s3, RUN, 3, 2, tree=TREE, meta={}, timeout=30) is not None


def test_a_blob_gone_before_the_commit_fails_the_step_naming_its_rank(s3):
    report = write(s3, 6, 1)
    write(s3, 6, 0)
    big = max(report["blobs"], key=lambda d: report["blobs"][d]["size"])
    s3.delete(fmt.blob_key(RUN, big))
    with pytest.raises(SnapshotError, match=f"blob {big[:12]} that rank 1 wrote"):
        commit_parts(s3, RUN, 6, 2, tree=TREE, meta={}, timeout=30)
    assert reader.list_steps(s3, RUN) == []


def two_ranks_persist_step_3(s3, make_tier) -> list[Tiers]:
    """Two ranks' tiers (``make_tier(rank)``) sharding into ``s3`` persist step 3 and
    flush; rank 0 commits it."""
    tiers = []
    for rank in range(2):
        tier = make_tier(rank)
        tier.shard_into(s3, rank, 2, timeout=30)
        tiers.append(tier)
    for rank, tier in enumerate(tiers):
        tensors, boxes = pieces(3, rank)
        tier.capture(3, TREE, tensors, {"reason": "periodic"}, persist=True, boxes=boxes)
    for tier in tiers:
        tier.flush(timeout=60)
    return tiers

def test_sharded_tiers_commit_prune_and_report_on_rank_0_only(s3):
    for step in (1, 2):
        write_snapshot(s3, RUN, Captured(step, TREE, full_state(step), {"reason": "periodic"}))
    commits: list[list[int]] = [[], []]
    tiers = two_ranks_persist_step_3(s3, lambda rank: Tiers(
        s3, RUN, keep=1, on_commit=lambda m: commits[rank].append(m["step"])))
    assert commits == [[3], []]
    assert reader.list_steps(s3, RUN) == [3]
    assert (tiers[0].committed_step, tiers[1].committed_step) == (3, None)


def test_sharded_tiers_keep_rank_0s_part_out_of_the_store(s3, monkeypatch):
    monkeypatch.setattr(tiers_mod, "LINGER_SECONDS", 0.0)  # the persisters leave when done
    two_ranks_persist_step_3(s3, lambda _rank: Tiers(s3, RUN, keep=2))
    for thread in [t for t in threading.enumerate() if t.name == "burst-persist"]:
        thread.join(timeout=30)
    assert reader.list_steps(s3, RUN) == [3]
    assert s3.list(fmt.parts_prefix(RUN, 3)) == [fmt.part_key(RUN, 3, 1)]


def test_a_rank_other_than_0_never_prunes(s3):
    for step in (1, 2):
        write_snapshot(s3, RUN, Captured(step, TREE, full_state(step), {"reason": "periodic"}))
    tier = Tiers(s3, RUN, keep=1)
    tier.shard_into(s3, 1, 2, timeout=30)
    tensors, boxes = pieces(3, 1)
    tier.capture(3, TREE, tensors, {"reason": "periodic"}, persist=True, boxes=boxes)
    tier.flush(timeout=60)
    assert reader.list_steps(s3, RUN) == [1, 2]
    assert s3.list(fmt.parts_prefix(RUN, 3)) == [fmt.part_key(RUN, 3, 1)]

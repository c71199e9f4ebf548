"""A corrupt shard in the newest sharded snapshot: every rank restores the one before it,
together and loudly (burst.parallel.fallback).

Real processes (``python -m torch.distributed.run``, gloo on CPU) train
``scripts/example_distributed.py`` as an FSDP2 pair with hidden layers of 1024, so rank 1's
rows of each big matrix are a blob of their own that only rank 1 reads back at two ranks.
The first leg leaves snapshots up to step 8 (which steps before it depends on how far the
background persister kept up: a newer shadow replaces a persist still queued); one byte of a blob holding only rank 1's rows of
step 8 is flipped; the second leg, at two ranks again, must resume at the snapshot before 8 on both ranks
(rank 0's own reads all verify), print a warning, and record an event naming step 8, rank 1
and the blob.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from burst.snapshot import format as fmt
from burst.snapshot import reader
from burst.store import open_store
from tests.parallel.test_scale_out import launch, steps
from tests.parallel.test_sharded import layout, resumed_at

pytestmark = pytest.mark.e2e

WIDE = ("--hidden", "1024", "--layers", "2")  # 4 MiB matrices: each rank's half its own blob
NEWEST = 8


def rank1_only_blob(manifest: dict) -> str:
    """A blob that holds rows of the second half of sharded tensors and nothing else."""
    users: dict[str, list[bool]] = {}
    for entry in manifest["tensors"].values():
        for shard in fmt.entry_shards(entry):
            second_half = fmt.is_sharded(entry) and shard["offsets"][0] > 0
            users.setdefault(shard["blob"], []).append(second_half)
    return next(digest for digest, halves in sorted(users.items()) if all(halves))


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, object, str, int]:
    """(workdir, the second leg's result, the corrupted blob's digest, the step before)."""
    workdir = tmp_path_factory.mktemp("corrupt-shard")
    first = launch(workdir, 2, "run", *layout(2), *WIDE)
    assert first.returncode == 0, first.stdout + first.stderr
    store = open_store(workdir / "store")
    *_, previous, newest = reader.list_steps(store, "run")
    assert newest == NEWEST
    digest = rank1_only_blob(reader.read_manifest(store, "run", NEWEST))
    flip_a_byte(workdir / "store" / fmt.blob_key("run", digest))
    second = launch(workdir, 2, "run", *layout(2), *WIDE)
    assert second.returncode == 0, second.stdout + second.stderr
    return workdir, second, digest, previous


def skipped_events(workdir: Path) -> list[dict]:
    found = []
    for path in workdir.rglob("events.jsonl"):
        found += [json.loads(line) for line in path.read_text().splitlines()
                  if '"snapshot-skipped"' in line]
    return found


def test_every_rank_restores_the_snapshot_before_the_corrupt_one(resumed):
    workdir, done, _, previous = resumed
    assert resumed_at(done) == previous
    replayed = [s["step"] for s in steps(workdir, "run")]
    assert replayed == list(range(1, NEWEST + 1))  # step 8 trained again, at both ranks


def test_the_skip_is_an_event_naming_the_snapshot_the_rank_and_the_blob(resumed):
    workdir, _, digest, previous = resumed
    messages = [event.get("message", "") for event in skipped_events(workdir)]
    assert any(f"run@{NEWEST} is unusable" in m and "rank 1:" in m and digest[:12] in m
               and f"falls back to step {previous}" in m for m in messages), messages


def test_rank_0_falls_back_for_a_blob_only_rank_1_reads(resumed):
    """Rank 0's own reads of step 8 all verified: it fell back because rank 1 failed."""
    workdir, _, _, _ = resumed
    messages = [event.get("message", "") for event in skipped_events(workdir)]
    assert messages and not any("rank 0:" in m for m in messages), messages


def test_the_skip_is_printed_as_a_warning(resumed):
    _, done, digest, _ = resumed
    assert f"run@{NEWEST} is unusable" in done.stderr and digest[:12] in done.stderr

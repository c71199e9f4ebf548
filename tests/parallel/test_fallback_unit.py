"""The ranks' agreed fallback (burst.parallel.fallback) on one process: the rules, without
a process group (the 2-rank case runs in tests/parallel/test_corrupt_shard_fallback.py)."""

from __future__ import annotations

import pytest

from burst.errors import SnapshotError
from burst.parallel import fallback
from burst.parallel.group import Group

SNAPSHOTS = {step: {"run_id": "run", "step": step} for step in (5, 7, 8)}


def older(step: int) -> dict | None:
    below = [s for s in SNAPSHOTS if s < step]
    return SNAPSHOTS[max(below)] if below else None


def failing_at(*steps: int):
    def load(manifest: dict) -> str:
        if manifest["step"] in steps:
            raise SnapshotError(f"blob abc{manifest['step']} is corrupt")
        return f"state of {manifest['step']}"
    return load


def test_a_damaged_snapshot_gives_way_to_the_newest_older_one_that_loads():
    logged: list[str] = []
    chosen, state = fallback.load_agreed(Group(), SNAPSHOTS[8], failing_at(8, 7), older,
                                         SNAPSHOTS.__getitem__, logged.append)
    assert (chosen["step"], state) == (5, "state of 5")
    assert logged == [
        "snapshot run@8 is unusable (rank 0: blob abc8 is corrupt); every rank falls back "
        "to step 7",
        "snapshot run@7 is unusable (rank 0: blob abc7 is corrupt); every rank falls back "
        "to step 5"]


def test_an_intact_snapshot_loads_without_a_word():
    logged: list[str] = []
    chosen, _ = fallback.load_agreed(Group(), SNAPSHOTS[8], failing_at(), older,
                                     SNAPSHOTS.__getitem__, logged.append)
    assert chosen["step"] == 8 and logged == []


def test_with_no_older_snapshot_left_the_restore_fails_saying_why():
    with pytest.raises(SnapshotError, match=r"run@5 is unusable \(rank 0: blob abc5 is "
                                            r"corrupt\), and none older.*no older snapshot"):
        fallback.load_agreed(Group(), SNAPSHOTS[5], failing_at(5), older,
                             SNAPSHOTS.__getitem__, lambda _: None)


def test_a_failure_that_is_not_damage_is_raised_not_fallen_back():
    def load(manifest: dict) -> str:
        raise RuntimeError("out of host memory")

    with pytest.raises(RuntimeError, match="out of host memory"):
        fallback.load_agreed(Group(), SNAPSHOTS[8], load, older, SNAPSHOTS.__getitem__,
                             lambda _: None)

"""``run.trackers``: after a resume each tracker continues the same run, with every step
once: no step the dead process logged is logged twice, none it lost is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from burst.errors import ConfigError
from burst.training.trackers import Record, Tracker, Trackers
from tests.conftest import ROOT
from tests.training import tracker_checks as checks


class Memory(Tracker):
    """A tracker whose stored records are a list; ``holds`` is what it says it stored."""

    name = "memory"

    def __init__(self, holds: int | None = None) -> None:
        super().__init__()
        self.written: list[Record] = []
        self.holds = holds
        self.opened_with: Mapping[str, Any] | None = None

    def open(self, saved: Mapping[str, Any] | None) -> None:
        self.opened_with = saved

    def stored_step(self, saved: Mapping[str, Any]) -> int | None:
        return self.holds

    def write(self, record: Record) -> None:
        self.written.append(record)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "run": "r1"}


def _logged(trackers: Trackers, steps: range) -> None:
    for step in steps:
        trackers.log({"loss": float(step)}, step=step)


def _resumed(state: dict, tracker: Memory) -> Trackers:
    trackers = Trackers()
    trackers.restore(state)
    trackers.add(tracker)
    return trackers


def test_a_tracker_reopens_the_run_its_snapshot_names():
    first = Trackers()
    first.add(Memory())
    _logged(first, range(1, 4))
    again = Memory()
    _resumed(first.state(), again)
    assert again.opened_with == {"last_step": 3, "run": "r1"}


def test_replayed_steps_the_tracker_holds_are_not_logged_again():
    first = Trackers()
    first.add(Memory())
    _logged(first, range(1, 6))
    snapshot = first.state()  # the snapshot at step 5; the dead process went on to 8
    again = Memory(holds=8)
    trackers = _resumed(snapshot, again)
    _logged(trackers, range(6, 11))  # the resumed run replays 6..8, then 9, 10
    assert [r.step for r in again.written] == [9, 10]


def test_steps_the_tracker_lost_are_logged_again_from_the_snapshot():
    first = Trackers()
    first.add(Memory())
    _logged(first, range(1, 6))
    again = Memory(holds=2)  # W&B kept only a block's worth: steps 1 and 2
    trackers = _resumed(first.state(), again)
    _logged(trackers, range(6, 8))
    assert [r.step for r in again.written] == [3, 4, 5, 6, 7]
    assert [r.values for r in again.written][:1] == [{"loss": 3.0}]


def test_a_tracker_that_trusts_the_snapshot_continues_after_its_last_step():
    first = Trackers()
    first.add(Memory())
    _logged(first, range(1, 4))
    again = Memory(holds=None)  # TensorBoard: purges whatever came after
    trackers = _resumed(first.state(), again)
    _logged(trackers, range(4, 6))
    assert [r.step for r in again.written] == [4, 5]


def test_non_numbers_are_not_logged():
    trackers = Trackers()
    memory = trackers.add(Memory())
    trackers.log({"loss": 1.5, "note": "text", "flag": True}, step=1)
    assert [r.values for r in memory.written] == [{"loss": 1.5}]


def test_trackers_added_before_attach_are_refused_at_restore():
    trackers = Trackers()
    trackers.add(Memory())
    with pytest.raises(ConfigError, match=r"after run\.attach"):
        trackers.restore({"trackers": {}})


def test_a_tracker_is_added_once():
    trackers = Trackers()
    trackers.add(Memory())
    with pytest.raises(ConfigError, match="already has"):
        trackers.add(Memory())


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory) -> Path:
    """The tracker loop killed in step 6 and in step 10, then finished: three processes."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    work = tmp_path_factory.mktemp("trackers")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DISABLE_CODE": "true", "MLFLOW_ALLOW_FILE_STORE": "true",
           "BURST_FREEZE": "0", "BURST_FAULT": "kill@6:1,kill@10:0", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, str(ROOT / "tests" / "training" / "tracker_loop.py"), "--run-id",
           "tracked", "--store", str(work / "store"), "--logs", str(work / "logs")]
    exits = [subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                            check=False) for _ in range(3)]
    assert [e.returncode for e in exits] == [-9, -9, 0], exits[-1].stderr[-3000:]
    return work / "logs"


STEPS = 12  # 48 samples / 8 a step x 2 epochs


@pytest.mark.e2e
def test_tensorboard_holds_each_step_once_after_two_resumes(killed_twice):
    assert checks.once_each(checks.tensorboard_steps(killed_twice / "tensorboard", "loss"),
                            STEPS)


@pytest.mark.e2e
def test_wandb_offline_holds_one_run_with_contiguous_steps(killed_twice):
    runs = checks.wandb_runs(killed_twice)
    assert len(runs) == 1
    assert checks.once_each(next(iter(runs.values())), STEPS)


@pytest.mark.e2e
def test_mlflow_file_store_holds_one_run_with_contiguous_steps(killed_twice):
    runs = checks.mlflow_runs("file://" + str(killed_twice / "mlruns"), "burst-test", "loss")
    assert len(runs) == 1
    assert checks.once_each(next(iter(runs.values())), STEPS)

"""Three real ``burst run`` agents sharing a modelled 10 GiB card with 6 GiB quotas each.

The low-priority run trains ``example_train.py``, held mid-training (``held_train.py``)
until the high-priority run arrives: its agent is asked to pause, SIGTERMs its child
(snapshot at the step boundary, exit 88), waits without counting a failure, and later
resumes; the normal run waits for memory. All three finish, and the paused run's result
is bitwise the uninterrupted one's. The high and normal children are short Python
programs, not training: what is tested of them is the agents' claims, and every torch
start costs seconds of CI time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from burst import events
from burst.store import LocalStore
from burst.supervise.coordinator import Coordinator
from tests.conftest import assert_same, final_state, step_records

pytestmark = pytest.mark.e2e

HELD = Path(__file__).with_name("held_train.py")
EXAMPLE_ARGS = ("--flush", "--shadow-every", "3")  # the shared reference's arguments


def agent(tmp_path: Path, run_id: str, priority: str, *child: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "burst.cli", "run", "--run-id", run_id,
           "--store", str(tmp_path / "store"), "--local", str(tmp_path / "store"),
           "--gpu-memory-quota", "6GiB", "--priority", priority, "--", *child]
    env = {**os.environ, "PYTHONHASHSEED": "0",
           "BURST_COORDINATOR_DIR": str(tmp_path / "coordinator"),
           "BURST_GPU_CAPACITY": "10GiB", "BURST_COORDINATOR_POLL": "0.05",
           "HOLD_FILE": str(tmp_path / f"{run_id}.held")}
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def short_job(done: Path) -> list[str]:
    """A child that works a moment and leaves ``done`` behind."""
    return [sys.executable, "-c",
            f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(done)!r}).touch()"]


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def state_of(tmp_path: Path, run_id: str) -> str | None:
    claims = Coordinator(tmp_path / "coordinator").claims()
    return next((c.state for c in claims if c.run_id == run_id), None)


def test_a_low_priority_run_pauses_for_a_high_one_and_finishes_with_nothing_lost(
        tmp_path, uninterrupted):
    reference = uninterrupted("--shadow-every", "3")
    agents = {"low": agent(tmp_path, "low", "low", sys.executable, str(HELD), "--records",
                           str(tmp_path / "low.jsonl"), "--final", str(tmp_path / "low.pt"),
                           *EXAMPLE_ARGS)}
    try:
        wait_for(lambda: (tmp_path / "low.held").exists(), "the low run is mid-training")
        agents["high"] = agent(tmp_path, "high", "high", *short_job(tmp_path / "high.done"))
        wait_for(lambda: state_of(tmp_path, "high") == "running", "the high run starts")
        agents["normal"] = agent(tmp_path, "normal", "normal",
                                 *short_job(tmp_path / "normal.done"))
        ended = {name: proc.communicate(timeout=180) for name, proc in agents.items()}
    finally:
        for proc in agents.values():
            proc.kill()
    for name, proc in agents.items():
        assert proc.returncode == 0, ended[name][1]
    assert (tmp_path / "high.done").exists() and (tmp_path / "normal.done").exists()
    low = events.read(LocalStore(tmp_path / "store"), "low")
    names = [e["event"] for e in low if e.get("source") == "agent"]
    assert "paused" in names and "unpaused" in names
    assert 88 in [e["returncode"] for e in low if e["event"] == "child-exit"]
    assert not [e for e in low if e["event"] == "policy"]  # a pause is no failure or retry
    high = events.read(LocalStore(tmp_path / "store"), "high")
    assert "paused" not in [e["event"] for e in high]
    expected = [r["indices"] for r in reference.records]
    assert [r["indices"] for r in step_records(tmp_path / "low.jsonl")] == expected
    assert_same(final_state(tmp_path, "low"), reference.final)
    assert Coordinator(tmp_path / "coordinator").claims() == []

"""The Lightning callback and the Accelerate helper: a run killed with SIGKILL mid-epoch
and started again continues at the exact sample, and ends with the same parameters,
optimizer, scheduler and RNG state as a run that never stopped."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.store import LocalStore
from tests.conftest import ROOT, assert_same, final_state

pytestmark = pytest.mark.e2e

EXAMPLES = {"lightning": ROOT / "scripts" / "example_lightning.py",
            "accelerate": ROOT / "scripts" / "example_accelerate.py"}


def train(framework: str, workdir: Path, run_id: str, fault: str = "") -> int:
    cmd = [sys.executable, str(EXAMPLES[framework]), "--run-id", run_id,
           "--store", str(workdir / "store"), "--records", str(workdir / f"{run_id}.jsonl"),
           "--final", str(workdir / f"{run_id}.pt")]
    env = {**os.environ, "PYTHONHASHSEED": "0", "BURST_FAULT": fault}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180,
                          check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode


def samples_by_step(path: Path) -> dict[tuple[int, int], list[int]]:
    """(step, micro-batch) -> sample indices; a replayed micro-batch replaces the killed one."""
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out[(record["step"], record["micro"])] = record["indices"]
    return out


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_killed_and_restarted_run_continues_exactly(framework, tmp_path):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (pip install -e '.[integrations]')")
    assert train(framework, tmp_path, "reference") == 0
    assert train(framework, tmp_path, "killed", fault="kill@5") == -9  # SIGKILL in step 5
    assert train(framework, tmp_path, "killed") == 0
    history = events.read(LocalStore(tmp_path / "store"), "killed")
    resume = next(e for e in history if e["event"] == "resume")
    assert 1 <= resume["step"] <= 4  # restored from a snapshot taken before the kill
    expected = samples_by_step(tmp_path / "reference.jsonl")
    assert samples_by_step(tmp_path / "killed.jsonl") == expected
    assert len(expected) == 24  # 2 epochs x 6 steps x 2 micro-batches
    assert_same(final_state(tmp_path, "killed"), final_state(tmp_path, "reference"))
    logged = [p for e in history if e["event"] == "metrics" for p in e["points"]]
    assert {p["step"] for p in logged} >= set(range(resume["step"] + 1, 13))

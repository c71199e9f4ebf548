"""Scale out through the launcher: a run killed on one process resumes with 2 ranks on
the local SkyPilot stub, and stays the same run as one that never stopped.

The first leg trains ``scripts/example_distributed.py`` (global batch 8, micro-batch 4,
15 steps) in one plain process and SIGKILLs itself at step 8, after its newest snapshot
(step 6, or 7) is stored. ``burst resume --to local --gpu L4 --count 2`` then plans two
GPUs per node; the task renders ``task-multinode.yaml.j2``, and the stub's fresh node
(``BURST_NODE_GPU=cpu``, ``SKYPILOT_NUM_GPUS_PER_NODE=2``) runs ``burst node run``, which
keeps the snapshot's micro-batch over the 2 processes torchrun starts there (gloo, CPU).

Checked against the uninterrupted single-process run: every optimizer step consumes
exactly its samples in its order, the global batch is 8 throughout, steps after the
resume ran on 2 ranks, and (one micro-batch of 4 per rank, see test_scale_out) the losses
and final model and optimizer state are bitwise equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.store import open_store
from tests.parallel.test_scale_out import (
    EXAMPLE,
    KILL_AT,
    STEPS,
    assert_bitwise,
    assert_killed,
    assert_same_samples,
    final_state,
    launch,
    reference,  # noqa: F401 (the fixture)
    resumed_from,
    steps,
)

pytestmark = pytest.mark.e2e
PY = sys.executable


def resume_on_stub(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    store = str(workdir / "store")
    cmd = [PY, "-m", "burst.cli", "resume", "run", "--to", "local", "--store", store,
           "--local", str(workdir / ".burst"), "--node-python", PY, "--stub-root",
           str(workdir / "nodes"), "--offline", *args,
           "--", "python", str(EXAMPLE), "--run-id", "run", "--store", store,
           "--records", str(workdir / "run"), "--parallel", "ddp"]
    env = {**os.environ, "BURST_NODE_GPU": "cpu", "PYTHONHASHSEED": "0", "BURST_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env,
                          timeout=240, check=False)


def test_killed_run_resumes_with_two_ranks_on_the_stub(tmp_path, reference):  # noqa: F811
    expected, expected_state = reference
    assert_killed(launch(tmp_path, 1, "run", "--kill-at", KILL_AT))

    done = resume_on_stub(tmp_path, "--gpu", "L4", "--count", "2")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "torch.distributed.run" in done.stdout  # the rendered task: torchrun on the node
    # the node's output, streamed back: its plan (1 node x 2 processes), rank 0's report
    assert "plan: world size 1 -> 2 (1 node(s) x 2 process(es))" in done.stdout
    assert "BURST_WORLD_SIZE=2" in done.stdout and "BURST_ACCUMULATION=1" in done.stdout
    at = resumed_from(done)
    assert "rank 0: resumed at step" in done.stdout and "world size 1 -> 2" in done.stdout

    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {at: 1, STEPS: 2})
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    assert_bitwise(final_state(tmp_path, "run"), expected_state)

    history = events.read(open_store(tmp_path / "store"), "run")
    start = next(e for e in history if e["event"] == "node-start")
    assert start["step"] == at and start["plan"]["world_size"] == 2
    assert start["plan"]["accumulation"] == 1
    assert len(list((tmp_path / "nodes").glob("*/node0/run.log"))) == 1  # one node, 2 ranks

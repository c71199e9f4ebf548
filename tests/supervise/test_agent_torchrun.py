"""The agent over torchrun: an OOM on one rank is still an OOM, though torchrun exits 1.

``burst drill`` runs ``scripts/example_distributed.py`` (global batch 8, micro-batch 4 per
rank, 15 steps) as two ranks under ``python -m torch.distributed.run --standalone`` (gloo,
CPU) and injects a real ``torch.cuda.OutOfMemoryError`` on rank 1 only, at step 8
(``BURST_FAULT=oom@8/1``). Rank 1 leaves an OOM failure record, torchrun stops rank 0 and
exits 1; the agent reads the records, retries with micro-batch 2 (accumulation 2) from the
newest snapshot, and every optimizer step consumes exactly the samples of the
uninterrupted single-process reference.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.store import open_store
from tests.parallel.test_scale_out import (
    EXAMPLE,
    STEPS,
    assert_same_samples,
    descendants,
    reference,  # noqa: F401 (the fixture)
    steps,
)

pytestmark = pytest.mark.e2e
PY = sys.executable
TIMEOUT = 240


def drill_two_ranks(workdir: Path, fault: str, *policy: str) -> tuple[dict, subprocess.CompletedProcess]:
    store = str(workdir / "store")
    cmd = [PY, "-m", "burst.cli", "drill", "--fault", fault, "--json", "--run-id", "run",
           "--store", store, *policy, "--",
           PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(EXAMPLE), "--run-id", "run", "--store", store, "--records",
           str(workdir / "run"), "--parallel", "ddp"]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "BURST_FREEZE": "0"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=workdir, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{cmd} hung for {TIMEOUT}s:\n{out}\n{err}")
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert "internal error in burst" not in err, err
    return json.loads(out), done


def test_an_oom_on_rank_1_retries_smaller_and_keeps_every_steps_samples(tmp_path, reference):  # noqa: F811
    expected, _ = reference
    report, done = drill_two_ranks(tmp_path, "oom@8/1", "--on-oom", "retry-smaller")
    assert done.returncode == 0, done.stderr[-4000:]
    assert report["outcome"] == "finished" and report["attempts"] == 2
    assert "rank 1 recorded oom (exit 86)" in done.stderr

    history = events.read(open_store(tmp_path / "store"), "run")
    first_exit = next(e for e in history if e["event"] == "child-exit")
    assert (first_exit["returncode"], first_exit["kind"], first_exit["code"]) == (1, "oom", 86)
    assert first_exit["rank"] == 1 and first_exit["decided_by"] == "record"
    policy = next(e for e in history if e["event"] == "policy")
    assert (policy["action"], policy["micro_batch"], policy["rank"]) == ("retry-smaller", 2, 1)

    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {STEPS: 2})  # 8 samples a step, 2 ranks throughout
    resumed = [e for e in history if e["event"] == "resume"][-1]
    assert (resumed["micro"], resumed["accumulation"], resumed["global"]) == (2, 2, 8)
    assert [s["loss"] for s in actual] == pytest.approx([s["loss"] for s in expected],
                                                        rel=1e-5)


def test_an_oom_on_rank_1_that_is_not_retried_exits_86_not_torchruns_1(tmp_path):
    report, done = drill_two_ranks(tmp_path, "oom@2/1", "--on-oom", "stop")
    assert done.returncode == 86, done.stderr[-4000:]
    assert report["outcome"] == "stop" and report["returncode"] == 86
    assert "burst resume run" in done.stderr

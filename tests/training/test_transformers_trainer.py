"""A real ``transformers.Trainer`` (tiny GPT-2 built from a config, shuffled data, gradient
accumulation, dropout, a cosine schedule) SIGKILLed at five points and run again with the
same command ends bitwise equal to a run that never stopped; re-planned to another
micro-batch, every optimizer step still trains on the same samples; TRL's SFTTrainer with
LoRA resumes to the same adapters, and its frozen base is uploaded once.

All runs of the module go through one harness process (``tests/training/trainer_harness``),
which imports transformers once and forks a child per run."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from burst import events
from burst.snapshot import reader, sync
from burst.store import LocalStore
from tests.conftest import ROOT, assert_same
from tests.training import tracker_checks as checks

pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

TRAIN = ["--samples", "48", "--epochs", "2", "--persist-every", "2"]  # 6 steps an epoch
STEPS = 12
# wide enough that the base's matrices pass the 1 MiB under which small tensors share a
# blob (with the changing adapters: those go up again, a few percent of a real base)
LORA = [*TRAIN, "--lora", "--keep", "100", "--width", "320"]
KILLS = {  # what a kill point means -> the fault that makes it
    "before-first-persist": {"env": {"BURST_FAULT": "kill@2:0"}},
    "mid-accumulation": {"env": {"BURST_FAULT": "kill@5:1"}},
    "epoch-boundary": {"env": {"BURST_FAULT": "kill@7:0"}},
    "during-persist": {"killpoint": ["reference", "blobs-written", 3]},
    "near-the-end": {"env": {"BURST_FAULT": "kill@12:1"}},
}


TRACKERS = ["tensorboard", "wandb", "mlflow"]
TRACKER_ENV = {"BURST_FAULT": "kill@6:1,kill@10:0", "WANDB_DIR": "wandb-logs",
               "WANDB_PROJECT": "burst-trainer", "MLFLOW_TRACKING_URI": "file:mlruns",
               "MLFLOW_EXPERIMENT_NAME": "burst-trainer"}


def _plan() -> list[dict]:
    plan = [{"run_id": "reference", "args": TRAIN, "log_points": True}]
    for name, kill in KILLS.items():
        plan += [{"run_id": name, "args": TRAIN, **kill}, {"run_id": name, "args": TRAIN}]
    plan += [{"run_id": "replanned", "args": TRAIN, "env": {"BURST_FAULT": "kill@5:1"}},
             {"run_id": "replanned", "args": TRAIN, "env": {"BURST_MICRO_BATCH": "2"}}]
    tracked = {"run_id": "tracked", "args": [*TRAIN, "--report-to", *TRACKERS],
               "env": TRACKER_ENV}
    plan += [tracked, tracked, tracked]  # killed in step 6 and in step 10, then to the end
    plan += [{"run_id": "lora-reference", "args": LORA},
             {"run_id": "lora", "args": LORA, "env": {"BURST_FAULT": "kill@5:1"}},
             {"run_id": "lora", "args": LORA}]
    return plan


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Every run of this module, once: (work directory, per-run exit codes and times)."""
    work = tmp_path_factory.mktemp("trainer")
    plan, out = work / "plan.json", work / "results.json"
    plan.write_text(json.dumps(_plan()))
    done = subprocess.run([sys.executable, "-m", "tests.training.trainer_harness", "--work",
                           str(work / "runs"), "--plan", str(plan), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return work / "runs", json.loads(out.read_text())


def _exits(results: list[dict], run_id: str) -> list[int]:
    return [r["exit"] for r in results if r["run_id"] == run_id]


def _final(work: Path, run_id: str) -> dict:
    return torch.load(work / f"{run_id}.pt", weights_only=True)


def _steps(work: Path, run_id: str) -> dict[int, list[int]]:
    """Step -> the samples it trained on, in order, as the last process to run it saw."""
    by_step: dict[int, dict[int, list[int]]] = collections.defaultdict(dict)
    for line in (work / f"{run_id}.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step[record["step"]].setdefault(record["pid"], []).extend(record["indices"])
    return {step: attempts[list(attempts)[-1]] for step, attempts in sorted(by_step.items())}


def _resumed_at(work: Path, run_id: str) -> int | None:
    history = events.read(LocalStore(work / "store"), run_id)
    return next((e["step"] for e in history if e["event"] == "resume"), None)


@pytest.mark.parametrize("kill", list(KILLS))
def test_sigkilled_trainer_run_rerun_ends_bitwise_equal(harness, kill):
    work, results = harness
    assert _exits(results, kill) == [-9, 0]
    reference, resumed = _final(work, "reference"), _final(work, kill)
    assert len(reference["losses"]) == STEPS
    assert resumed["losses"] == reference["losses"]  # every logged loss, bitwise
    assert_same(resumed["model"], reference["model"])
    assert torch.equal(resumed["rng"], reference["rng"])
    assert _steps(work, kill) == _steps(work, "reference")
    if kill != "before-first-persist":
        assert _resumed_at(work, kill) is not None  # it did resume, not start over


def test_kill_before_the_first_persist_starts_over(harness):
    work, _ = harness
    assert _resumed_at(work, "before-first-persist") is None


def test_replanned_micro_batch_keeps_every_steps_samples(harness):
    work, results = harness
    assert _exits(results, "replanned") == [-9, 0]
    history = events.read(LocalStore(work / "store"), "replanned")
    resume = next(e for e in history if e["event"] == "resume")
    assert (resume["micro"], resume["accumulation"]) == (2, 4)
    steps, expected = _steps(work, "replanned"), _steps(work, "reference")
    assert steps == expected and len(steps) == STEPS
    final, reference = _final(work, "replanned"), _final(work, "reference")
    # before the resume, the same run; after it, other dropout draws for other micro-batch
    # shapes: the same samples per step, not the same numbers
    assert final["losses"][:resume["step"]] == reference["losses"][:resume["step"]]
    assert len(final["losses"]) == STEPS


def test_resume_time_does_not_grow_with_the_position_in_the_epoch(harness):
    """The time from the re-run's start to its first step, for an early and a late kill
    (printed: a ratio for the record, never a timed assertion)."""
    work, results = harness
    seconds = {}
    for run_id in ("mid-accumulation", "near-the-end"):
        started = [r["started"] for r in results if r["run_id"] == run_id][-1]
        first = min(json.loads(line)["time"]
                    for line in (work / f"{run_id}.jsonl").read_text().splitlines()
                    if json.loads(line)["time"] >= started)
        seconds[run_id] = first - started
    early, late = _resumed_at(work, "mid-accumulation"), _resumed_at(work, "near-the-end")
    print(f"\nresume to first step: early kill (resumed at step {early}) "
          f"{seconds['mid-accumulation']:.2f} s, late kill (step {late}) "
          f"{seconds['near-the-end']:.2f} s, ratio late/early "
          f"{seconds['near-the-end'] / seconds['mid-accumulation']:.2f}")
    assert late > early


def test_sft_lora_resumed_adapters_equal_the_uninterrupted_runs(harness):
    work, results = harness
    assert _exits(results, "lora") == [-9, 0]
    reference, resumed = _final(work, "lora-reference"), _final(work, "lora")
    adapters = [name for name in reference["model"] if "lora_" in name]
    assert adapters
    assert_same({n: resumed["model"][n] for n in adapters},
                {n: reference["model"][n] for n in adapters})
    assert_same(resumed["model"], reference["model"])
    assert resumed["losses"] == reference["losses"]


def test_lora_frozen_base_is_uploaded_once(harness, tmp_path):
    """Push the LoRA run's snapshots one by one to an empty store, as the upload queue
    does: the first carries the frozen base, the later ones only what training changed."""
    work, _ = harness
    local, remote = LocalStore(work / "store"), LocalStore(tmp_path / "remote")
    steps = reader.list_steps(local, "lora-reference")
    assert len(steps) >= 4
    sent = [sync.push_snapshot(local, remote, "lora-reference", step).bytes_sent
            for step in steps]
    base = sum(t.numel() * t.element_size()
               for name, t in _final(work, "lora-reference")["model"].items()
               if "lora_" not in name)
    print(f"\nbytes uploaded per LoRA snapshot: {sent} (frozen base {base} bytes)")
    assert sent[0] > base
    assert all(later < base / 4 for later in sent[1:])


def test_report_to_trackers_continue_the_same_run_after_two_kills(harness):
    """``report_to=["tensorboard", "wandb", "mlflow"]``: one run each, every step once."""
    work, results = harness
    assert _exits(results, "tracked") == [-9, -9, 0]
    assert _final(work, "tracked")["losses"] == _final(work, "reference")["losses"]
    (log_dir,) = (work / "out" / "tracked" / "runs").iterdir()  # one directory, kept
    assert checks.once_each(checks.tensorboard_steps(log_dir, "train/loss"), STEPS)
    wandb_runs = checks.wandb_runs(work / "wandb-logs")
    assert len(wandb_runs) == 1
    assert checks.once_each(next(iter(wandb_runs.values())), STEPS)
    mlflow_runs = checks.mlflow_runs(f"file:{work / 'mlruns'}", "burst-trainer", "train/loss")
    assert len(mlflow_runs) == 1
    assert checks.once_each(next(iter(mlflow_runs.values())), STEPS)


def test_drilled_oom_under_the_agent_replans_the_trainer_and_finishes(tmp_path):
    """``burst drill --fault oom@5``: a real CUDA OOM error in step 5, burst's emergency
    snapshot and exit 86; the agent runs the same command again with half the
    micro-batch and twice the accumulation, applied to the TrainingArguments."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BURST_FREEZE": "0", "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "burst.cli", "drill", "--fault", "oom@5", "--run-id", "drilled",
         "--store", str(tmp_path / "store"), "--", sys.executable,
         str(ROOT / "scripts" / "example_transformers.py"), *TRAIN, "--final",
         str(tmp_path / "final.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    history = events.read(LocalStore(tmp_path / "store"), "drilled")
    resume = next(e for e in history if e["event"] == "resume")
    assert (resume["micro"], resume["accumulation"]) == (2, 4)
    assert len(_final(tmp_path, "final")["losses"]) == STEPS

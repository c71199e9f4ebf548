"""The agent and the in-process failure handling, with real faults in real subprocesses.

Every case trains ``scripts/example_train.py`` (global batch 16, micro-batch 8, so 2
micro-batches per step; 7 steps per epoch, 21 in all) under ``burst drill``, which
injects one fault into the first attempt, and checks the recovery point (steps lost),
what the agent did, and that every optimizer step consumed exactly the samples of an
uninterrupted run. The recovery points asserted here are the ones the README lists.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from burst import events
from burst.snapshot import reader
from burst.store import LocalStore
from tests.conftest import EXAMPLE, assert_same, final_state, step_records

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(uninterrupted):
    """One uninterrupted run, shared by every case."""
    return uninterrupted("--shadow-every", "3").workdir


def drill(tmp_path, fault: str, *policy: str, example_args: tuple[str, ...] = ()) -> tuple[dict, subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "burst.cli", "drill", "--fault", fault, "--json",
           "--run-id", "drilled", "--store", str(tmp_path / "store"), *policy, "--",
           sys.executable, str(EXAMPLE), "--records", str(tmp_path / "drilled.jsonl"),
           "--final", str(tmp_path / "drilled.pt"), "--flush", "--shadow-every", "3",
           *example_args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout), done


def same_samples_per_step(tmp_path, reference) -> bool:
    expected = step_records(reference / "reference.jsonl")
    actual = step_records(tmp_path / "drilled.jsonl")
    return [r["indices"] for r in actual] == [r["indices"] for r in expected]


def history(tmp_path) -> list[dict]:
    return events.read(LocalStore(tmp_path / "store"), "drilled")


def test_oom_in_forward_retries_smaller_and_loses_nothing(tmp_path, reference):
    report, done = drill(tmp_path, "oom@8")
    assert done.returncode == 0 and report["outcome"] == "finished"
    assert report["steps_lost"] == 0 and report["attempts"] == 2
    resume = next(e for e in history(tmp_path) if e["event"] == "resume")
    assert (resume["micro"], resume["accumulation"], resume["global"]) == (4, 4, 16)
    assert same_samples_per_step(tmp_path, reference)


def test_oom_inside_the_optimizer_step_falls_back_to_the_ram_shadow(tmp_path, reference):
    report, done = drill(tmp_path, "oom-optimizer@8")
    assert done.returncode == 0
    assert report["resumed_from_step"] == 6 and report["steps_lost"] == 1  # <= shadow_every
    failure = next(e for e in history(tmp_path) if e["event"] == "failure")
    assert failure["in_optimizer_step"] is True and failure["snapshot_step"] == 6
    assert same_samples_per_step(tmp_path, reference)


def test_a_sticky_gpu_error_persists_the_ram_shadow_and_restarts_exactly(tmp_path, reference):
    report, done = drill(tmp_path, "sticky@8", "--on-gpu-failure", "restart")
    assert done.returncode == 0
    assert report["resumed_from_step"] == 6 and report["steps_lost"] <= 3  # shadow interval
    reasons = [e["reason"] for e in history(tmp_path) if e["event"] == "snapshot"]
    assert "gpu-failure" in reasons
    assert same_samples_per_step(tmp_path, reference)
    assert_same(final_state(tmp_path, "drilled"), final_state(reference, "reference"))


def test_sigterm_snapshots_at_the_next_step_boundary_and_stops(tmp_path):
    report, done = drill(tmp_path, "term@8")
    assert done.returncode == 88 and report["outcome"] == "stopped"
    manifest = reader.read_manifest(LocalStore(tmp_path / "store"), "drilled")
    assert manifest["step"] == 8 and manifest["reason"] == "signal"  # the step in flight completed
    assert step_records(tmp_path / "drilled.jsonl")[-1]["step"] == 8


def test_sigkill_leaves_the_newest_persisted_snapshot_resumable(tmp_path, reference):
    report, done = drill(tmp_path, "kill@8", "--on-killed", "restart")
    assert done.returncode == 0
    assert report["resumed_from_step"] == 6 and report["steps_lost"] == 1  # <= persist interval
    reader.verify(LocalStore(tmp_path / "store"), "drilled", 6)
    assert same_samples_per_step(tmp_path, reference)
    assert_same(final_state(tmp_path, "drilled"), final_state(reference, "reference"))


def test_an_oom_that_cannot_shrink_further_stops_with_the_resume_command(tmp_path):
    report, done = drill(tmp_path, "oom@2", "--on-oom", "retry-smaller", "--backoff", "3",
                         example_args=("--global-batch", "4", "--micro-batch", "2",
                                       "--epochs", "1"))
    assert done.returncode == 86 and report["outcome"] == "stop"
    assert "burst resume drilled" in done.stderr


def test_a_bug_in_the_training_script_is_not_retried(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "burst.cli", "run", "--run-id", "bug", "--store",
         str(tmp_path / "store"), "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert "not a GPU failure, so no retry" in done.stderr


def test_sigterm_flushes_the_upload_to_a_remote_store_before_exit(tmp_path, seaweed, monkeypatch):
    from tests.helpers.store_servers import aws_env

    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    if seaweed.ca_bundle:
        monkeypatch.setenv("BURST_CA_BUNDLE", seaweed.ca_bundle)
    remote = seaweed.url()
    cmd = [sys.executable, "-m", "burst.cli", "drill", "--fault", "term@5", "--json",
           "--run-id", "preempted", "--store", remote, "--local", str(tmp_path / "local"),
           "--", sys.executable, str(EXAMPLE), "--records", str(tmp_path / "r.jsonl"),
           "--final", str(tmp_path / "f.pt"), "--persist-every", "100"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 88, done.stderr
    from burst.store import open_store

    store = open_store(remote, endpoint_url=seaweed.endpoint, addressing_style="path",
                       ca_bundle=seaweed.ca_bundle)
    manifest = reader.read_manifest(store, "preempted")
    assert manifest["step"] == 5 and manifest["reason"] == "signal"
    reader.verify(store, "preempted", 5)
    assert any(e["event"] == "failure" for e in events.read(store, "preempted"))

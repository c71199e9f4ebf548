"""``burst resume`` end to end: a run fails locally and finishes on another "node".

Every case trains ``scripts/example_train.py`` (64 samples, global batch 16, micro-batch 8:
4 steps per epoch, 8 in all) as a project of its own, against a real S3-compatible server
on loopback (SeaweedFS over TLS), injects a GPU failure at step 5, and resumes through a
launcher: the local SkyPilot stub (fresh node directory, own HOME, SKYPILOT_* variables)
or the ``ssh`` launcher against a real OpenSSH server on 127.0.0.1. The node restores the
code archive, checks the environment (the test's interpreter, via ``--node-python``: no
package index is reachable), pulls the snapshot, re-plans for the CPU it finds and trains
on. Kept layouts must end bitwise equal to an uninterrupted run; a re-planned split must
feed every optimizer step the same samples.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.store import open_store
from tests.conftest import EXAMPLE, assert_same, step_records
from tests.helpers.store_servers import aws_env

pytestmark = pytest.mark.e2e
ARGS = ("--samples", "64", "--epochs", "2", "--flush")
PY = sys.executable


@pytest.fixture(scope="module")
def reference(uninterrupted) -> tuple[list[dict], dict]:
    run = uninterrupted(*ARGS)
    return run.records, run.final


@pytest.fixture
def s3(seaweed, monkeypatch, tmp_path):
    """Credentials in the environment only; the store's settings as BURST_* variables."""
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("BURST_CA_BUNDLE", seaweed.ca_bundle)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("BURST_NODE_GPU", "cpu")  # the node re-plans for what it has: a CPU
    monkeypatch.setenv("BURST_OFFLINE", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    return seaweed.url()


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(EXAMPLE, root / "train.py")
    return root


def burst(*args: str, cwd: Path, env: dict | None = None, timeout: int = 280
          ) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "burst.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=timeout,
                          check=False)


def train_until_failure(project: Path, url: str, run_id: str, records: Path) -> None:
    """Train with the library alone until an injected GPU failure at step 5 (exit 87)."""
    done = subprocess.run([PY, "train.py", "--run-id", run_id, "--store", url, "--records",
                           str(records), "--final", "final.pt", *ARGS], cwd=project,
                          capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "BURST_FAULT": "sticky@5",
                               "BURST_LOCAL": str(project / ".burst")})
    assert done.returncode == 87, done.stderr


def entry_point(records: Path) -> list[str]:
    return ["--", "python", "train.py", "--records", str(records), "--final", "final.pt", *ARGS]


def node_finals(root: Path) -> list[Path]:
    return sorted(root.glob("*/node0/home/burst-node/code/final.pt"))


def status(url: str, run_id: str, project: Path) -> dict:
    done = burst("status", run_id, "--store", url, "--local", str(project / ".burst"), "--json",
                 cwd=project)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_agent_bursts_to_the_stub_and_the_run_finishes_bitwise(s3, project, tmp_path,
                                                               reference):
    records, nodes = tmp_path / "records.jsonl", tmp_path / "nodes"
    done = burst("run", "--run-id", "agent", "--store", s3, "--local", str(project / ".burst"),
                 "--on-gpu-failure", "burst", "--burst-to", "local", "--", PY, "train.py",
                 "--records", str(records), "--final", "final.pt", *ARGS, cwd=project,
                 env={"BURST_FAULT": "sticky@5", "BURST_NODE_PYTHON": PY,
                      "BURST_STUB_ROOT": str(nodes)})
    assert "handed to burst resume (exit 0)" in done.stderr, done.stderr[-3000:]
    finals = node_finals(nodes)
    assert len(finals) == 1, "the run must finish in the node directory"
    import torch

    assert_same(torch.load(finals[0], weights_only=True), reference[1])
    assert step_records(records) == reference[0]
    assert not (project / "final.pt").exists()
    state = status(s3, "agent", project)
    assert state["where"]["state"] == "finished" and state["snapshot"]["step"] == 8
    assert state["plan"]["source"] == "node" and state["plan"]["micro_batch"] == 8


def test_replanned_split_feeds_every_step_the_same_samples(s3, project, tmp_path, reference):
    records, nodes = tmp_path / "records.jsonl", tmp_path / "nodes"
    train_until_failure(project, s3, "replan", records)
    store = open_store(s3)
    newest = store.list("replan/snapshots/")[-1]
    store.delete(newest)  # the crash beat the upload: the local tier holds the newest
    done = burst("resume", "replan", "--to", "local", "--store", s3, "--local",
                 str(project / ".burst"), "--node-python", PY, "--stub-root", str(nodes),
                 "--micro-batch", "4", *entry_point(records), cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pushing the newer local snapshot replan@4" in done.stderr
    assert "micro-batch 8 -> 4, accumulation 2 -> 4" in done.stdout
    got = step_records(records)
    assert [r["step"] for r in got] == list(range(1, 9))
    for mine, theirs in zip(got, reference[0], strict=True):
        assert mine["indices"] == theirs["indices"]  # the same samples, in the same order
        assert len(mine["indices"]) == 16  # the global batch never changes
    assert len(node_finals(nodes)) == 1
    state = status(s3, "replan", project)
    assert state["plan"]["micro_batch"] == 4 and state["plan"]["accumulation"] == 4
    assert state["last_failure"]["kind"] == "gpu-failure"


def test_stub_falls_back_over_capacity_and_recovers_from_preemption(s3, project, tmp_path,
                                                                    reference):
    records, nodes = tmp_path / "records.jsonl", tmp_path / "nodes"
    train_until_failure(project, s3, "spot", records)
    done = burst("resume", "spot", "--to", "local", "--store", s3, "--local",
                 str(project / ".burst"), "--node-python", PY, "--stub-root", str(nodes),
                 "--gpu", "L4,A100", "--stub-fail-first", "2", "--stub-preempt-at", "7",
                 *entry_point(records), cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    launched = [line for line in done.stderr.splitlines() if "stub: launching" in line]
    # L4 and A100 spot are refused for capacity; L4 on-demand is preempted; the recovery
    # walks the ordered list from the top again (EAGER_NEXT_REGION), where L4 spot is back
    assert [line.split("launching ", 1)[1].split(" on ")[0] for line in launched] == [
        "L4:1 at any (on-demand)", "L4:1 at any (spot)"]
    history = events.read(open_store(s3), "spot")
    names = [e["event"] for e in history]
    assert names.count("capacity") == 2 and names.count("preempted") == 1
    starts = [e for e in history if e["event"] == "node-start"]
    assert [e["step"] for e in starts] == [4, 7]  # the preempted node snapshotted step 7
    assert len({e["task_id"] for e in starts}) == 1  # SKYPILOT_TASK_ID survives recovery
    assert [e["restarts"] for e in starts] == [0, 1]  # counted in the store, under the bound
    assert len({e["node_dir"] for e in starts}) == 2  # a fresh node each time
    finals = node_finals(nodes)
    assert len(finals) == 1
    import torch

    assert_same(torch.load(finals[0], weights_only=True), reference[1])
    assert step_records(records) == reference[0]


def test_ssh_launcher_runs_the_same_end_to_end_resume(s3, project, tmp_path, reference, sshd):
    records, remote = tmp_path / "records.jsonl", tmp_path / "remote"
    train_until_failure(project, s3, "box", records)
    user = sshd.config.read_text().split("User ", 1)[1].split()[0]
    done = burst("resume", "box", "--to", f"ssh://{user}@127.0.0.1:{sshd.port}", "--store", s3,
                 "--local", str(project / ".burst"), "--node-python", PY, "--known-hosts",
                 str(sshd.known_hosts), "--identity", str(sshd.client_key), "--remote-dir",
                 str(remote), *entry_point(records), cwd=project)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "resumed at step 4" in done.stdout  # the node's output, streamed back
    finals = sorted(remote.glob("*/code/final.pt"))
    assert len(finals) == 1
    import torch

    assert_same(torch.load(finals[0], weights_only=True), reference[1])
    assert step_records(records) == reference[0]
    assert status(s3, "box", project)["where"]["state"] == "finished"

"""``burst resume --to ssh://... --count 2`` on a box without GPUs runs two ranks (gloo).

No SkyPilot runs on an SSH box, so the launcher itself sets what the task's torchrun line
and ``burst node run``'s plan read (``SKYPILOT_NUM_GPUS_PER_NODE=2``, node 0 of 1): the
plan's world size and the processes torchrun starts are the same 2.

The first leg trains ``scripts/example_distributed.py`` (global batch 8, micro-batch 4,
15 steps) in one plain process against a real S3-compatible server on loopback (SeaweedFS
over TLS) and SIGKILLs itself at step 8, after its newest snapshot is stored. The resume
goes through the real OpenSSH server on 127.0.0.1 and must finish on 2 ranks, every
optimizer step consuming exactly the samples of the uninterrupted single-process run (one
micro-batch of 4 per rank: losses bitwise equal, see tests/parallel/test_scale_out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.snapshot import reader as snapshot
from burst.store import open_store
from tests.helpers.store_servers import aws_env
from tests.parallel.test_scale_out import (
    EXAMPLE,
    KILL_AT,
    STEPS,
    assert_killed,
    assert_same_samples,
    reference,  # noqa: F401 (the fixture)
    resumed_from,
    steps,
)

pytestmark = pytest.mark.e2e
PY = sys.executable


@pytest.fixture
def s3(seaweed, monkeypatch):
    """Credentials in the environment only; the store's settings as BURST_* variables."""
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("BURST_CA_BUNDLE", seaweed.ca_bundle)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("BURST_OFFLINE", "1")
    monkeypatch.setenv("BURST_FREEZE", "0")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    return seaweed.url()


def train(workdir: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [PY, str(EXAMPLE), "--run-id", "run", "--store", url, "--records",
           str(workdir / "run"), *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "BURST_LOCAL": str(workdir / ".burst")},
                          check=False)


def test_count_2_on_a_cpu_box_runs_two_gloo_ranks_and_finishes(s3, sshd, tmp_path,
                                                               reference):  # noqa: F811
    expected, _ = reference
    assert_killed(train(tmp_path, s3, "--kill-at", KILL_AT))

    user = sshd.config.read_text().split("User ", 1)[1].split()[0]
    done = subprocess.run(
        [PY, "-m", "burst.cli", "resume", "run", "--to", f"ssh://{user}@127.0.0.1:{sshd.port}",
         "--gpu", "L4", "--count", "2", "--store", s3, "--local", str(tmp_path / ".burst"),
         "--node-python", PY, "--known-hosts", str(sshd.known_hosts), "--identity",
         str(sshd.client_key), "--remote-dir", str(tmp_path / "remote"), "--offline",
         "--", "python", str(EXAMPLE), "--run-id", "run", "--store", s3, "--records",
         str(tmp_path / "run"), "--parallel", "ddp"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    assert "no GPU(s); running 2 process(es)" in done.stderr
    assert "plan: world size 1 -> 2 (1 node(s) x 2 process(es))" in done.stdout
    at = resumed_from(done)

    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {at: 1, STEPS: 2})  # ran on 2 ranks after `at`
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    store = open_store(s3)
    assert snapshot.read_manifest(store, "run")["step"] == STEPS
    start = next(e for e in events.read(store, "run") if e["event"] == "node-start")
    assert start["plan"]["world_size"] == 2

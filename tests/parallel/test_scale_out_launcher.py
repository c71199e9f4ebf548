"""Scale out through a launcher: a run killed on one process resumes with 2 ranks on a node
without GPUs, and stays the same run as one that never stopped.

The first leg trains ``scripts/example_distributed.py`` (global batch 8, micro-batch 4,
15 steps) in one plain process and SIGKILLs itself at step 8, after its newest snapshot
(step 6, or 7) is stored. ``burst resume --gpu L4 --count 2`` then plans two GPUs per node,
through either launcher:

- ``local``: the local SkyPilot stub, with the run's store a directory. The task renders
  ``task-multinode.yaml.j2``, and the stub's fresh node (``BURST_NODE_GPU=cpu``,
  ``SKYPILOT_NUM_GPUS_PER_NODE=2``) runs ``burst node run``.
- ``ssh``: ``--to ssh://...`` against a real OpenSSH server on 127.0.0.1, with the run's
  store a real S3-compatible server on loopback (SeaweedFS over TLS). No SkyPilot runs on
  an SSH box, so the launcher itself sets what the task's torchrun line and ``burst node
  run``'s plan read (``SKYPILOT_NUM_GPUS_PER_NODE=2``, node 0 of 1).

Either way the node keeps the snapshot's micro-batch over the 2 processes torchrun starts
there (gloo, CPU). Checked against the uninterrupted single-process run: every optimizer
step consumes exactly its samples in its order, the global batch is 8 throughout, steps
after the resume ran on 2 ranks, and (one micro-batch of 4 per rank, see test_scale_out)
the losses and final model and optimizer state are bitwise equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from burst import events
from burst.snapshot import reader
from burst.snapshot.tensors import load_tensors
from burst.store import open_store
from tests.helpers.store_servers import aws_env
from tests.parallel.test_scale_out import (
    EXAMPLE,
    KILL_AT,
    STEPS,
    assert_bitwise,
    assert_killed,
    assert_same_samples,
    launch,
    reference,  # noqa: F401 (the fixture)
    resumed_from,
    steps,
)

pytestmark = pytest.mark.e2e
PY = sys.executable


@dataclass(frozen=True)
class Launcher:
    """How one launcher's leg runs: the run's store, how the first leg trains into it, and
    what ``burst resume`` needs to reach the node."""

    name: str
    store: str
    to: str
    options: tuple[str, ...]
    env: dict[str, str]

    def train_until_killed(self, workdir: Path) -> subprocess.CompletedProcess:
        if self.name == "local":
            return launch(workdir, 1, "run", "--kill-at", KILL_AT)
        cmd = [PY, str(EXAMPLE), "--run-id", "run", "--store", self.store, "--records",
               str(workdir / "run"), "--kill-at", KILL_AT]
        return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=240,
                              env={**os.environ, "BURST_LOCAL": str(workdir / ".burst")},
                              check=False)

    def resume(self, workdir: Path, *args: str) -> subprocess.CompletedProcess:
        cmd = [PY, "-m", "burst.cli", "resume", "run", "--to", self.to, "--store", self.store,
               "--local", str(workdir / ".burst"), "--node-python", PY, *self.options,
               "--offline", *args, "--", "python", str(EXAMPLE), "--run-id", "run",
               "--store", self.store, "--records", str(workdir / "run"), "--parallel", "ddp"]
        return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=300, check=False)


@pytest.fixture(params=["local", "ssh"])
def launcher(request, tmp_path, monkeypatch) -> Launcher:
    """The local stub over a directory store, or a real sshd over SeaweedFS."""
    if request.param == "local":
        return Launcher("local", str(tmp_path / "store"), "local",
                        ("--stub-root", str(tmp_path / "nodes")),
                        {"BURST_NODE_GPU": "cpu", "PYTHONHASHSEED": "0", "BURST_OFFLINE": "1"})
    seaweed, sshd = request.getfixturevalue("seaweed"), request.getfixturevalue("sshd")
    aws_env(monkeypatch)  # credentials in the environment only; the store's settings too
    for name, value in {"BURST_ENDPOINT_URL": seaweed.endpoint,
                        "BURST_CA_BUNDLE": seaweed.ca_bundle, "BURST_ADDRESSING_STYLE": "path",
                        "BURST_OFFLINE": "1", "BURST_FREEZE": "0",
                        "PYTHONHASHSEED": "0"}.items():
        monkeypatch.setenv(name, value)
    user = sshd.config.read_text().split("User ", 1)[1].split()[0]
    return Launcher("ssh", seaweed.url(), f"ssh://{user}@127.0.0.1:{sshd.port}",
                    ("--known-hosts", str(sshd.known_hosts), "--identity",
                     str(sshd.client_key), "--remote-dir", str(tmp_path / "remote")), {})


def final_state(store: str) -> dict:
    """Model and optimizer tensors of the run's last snapshot, which is its last step's."""
    opened = open_store(store)
    manifest = reader.read_manifest(opened, "run")
    assert manifest is not None and manifest["step"] == STEPS
    tensors = load_tensors(opened, manifest)
    return {k: v for k, v in tensors.items() if k.startswith(("state/model", "state/optimizer"))}


def test_killed_run_resumes_with_two_ranks_on_a_node_without_gpus(launcher, tmp_path,
                                                                   reference):  # noqa: F811
    expected, expected_state = reference
    assert_killed(launcher.train_until_killed(tmp_path))

    done = launcher.resume(tmp_path, "--gpu", "L4", "--count", "2")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "torch.distributed.run" in done.stdout  # the rendered task: torchrun on the node
    # the node's output, streamed back: its plan (1 node x 2 processes), rank 0's report
    assert "plan: world size 1 -> 2 (1 node(s) x 2 process(es))" in done.stdout
    assert "BURST_WORLD_SIZE=2" in done.stdout and "BURST_ACCUMULATION=1" in done.stdout
    at = resumed_from(done)
    assert "rank 0: resumed at step" in done.stdout and "world size 1 -> 2" in done.stdout

    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {at: 1, STEPS: 2})  # ran on 2 ranks after `at`
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    assert_bitwise(final_state(launcher.store), expected_state)

    history = events.read(open_store(launcher.store), "run")
    start = next(e for e in history if e["event"] == "node-start")
    assert start["step"] == at and start["plan"]["world_size"] == 2
    assert start["plan"]["accumulation"] == 1
    if launcher.name == "local":
        assert len(list((tmp_path / "nodes").glob("*/node0/run.log"))) == 1  # one node, 2 ranks
    else:
        assert "no GPU(s); running 2 process(es)" in done.stderr

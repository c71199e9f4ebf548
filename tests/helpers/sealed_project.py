"""The project both sealed end-to-end tests train and resume (issue 15's acceptance):
``train.py`` plus a local module it imports, the launching side's environment (pip with no
index at all), and session fixtures for what the two tests share: the uninterrupted
reference run and the wheel cache (the wheelhouse is repacked from this venv once per
session; wheels are content-addressed, so the second test uploads none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_same, step_records
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, free_port

PY = sys.executable
ARGS = ("--samples", "64", "--epochs", "2")
STORE_NAME = "sealed"  # the prefix in the test bucket both sealed tests share

MODEL = '''\
"""The project's own module: the node gets it from the code archive, nowhere else."""
import torch


def build() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3))
'''

TRAIN = '''\
"""Train with burst; record each step and, with --seen, which paths this machine shows."""
import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from model import build

p = argparse.ArgumentParser()
p.add_argument("--run-id")
p.add_argument("--store")
p.add_argument("--samples", type=int, default=64)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--seen", nargs="*", default=[])
args = p.parse_args()
with open("seen.json", "w") as out:
    json.dump({"paths": {path: os.path.exists(path) for path in args.seen},
               "executable": sys.executable, "prefix": sys.prefix,
               "burst": burst.__file__, "torch": torch.__file__}, out)
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1234)
data = burst.SeededDataset(TensorDataset(torch.randn(args.samples, 12, generator=g),
                                         torch.randint(0, 3, (args.samples,), generator=g),
                                         torch.arange(args.samples)), seed=7)
model = build()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
run = burst.Run(args.run_id, store=args.store, global_batch=16, micro_batch=8, keep=100,
                shadow_every=1, persist_every=2)
run.attach(model, optimizer, scheduler)
sampler = burst.ResumableSampler(data, seed=3)
loader = DataLoader(data, batch_size=run.micro_batch, sampler=sampler)
with open("records.jsonl", "a") as records:
    for epoch in run.epochs(args.epochs):
        for step in run.steps(loader):
            indices, total = [], 0.0
            for x, y, index in step:
                loss = torch.nn.functional.cross_entropy(model(x), y) * step.weight(len(x))
                loss.backward()
                indices += index.tolist()
                total += loss.item()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            run.flush()
            records.write(json.dumps({"step": step.index, "loss": total.hex(),
                                      "indices": indices}) + "\\n")
            records.flush()
run.close()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict()}, "final.pt")
'''


def make_project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model.py").write_text(MODEL)
    (root / "train.py").write_text(TRAIN)
    return root


def environment(endpoint: str, nodes: Path, cache: Path) -> dict[str, str]:
    """This machine's environment for the test's commands: the store's settings and
    credentials, a CPU node, a node that must be sealed, and pip with no index at all (no
    configuration, a dead loopback index, ``no-index``): the wheelhouse is repacked from
    this venv, never fetched, into ``cache``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "BURST_", "PIP_", "UV_"))}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_RETRIES": "0",
                "PIP_INDEX_URL": f"http://127.0.0.1:{free_port()}/simple",
                "BURST_WHEEL_CACHE": str(cache)})
    env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "BURST_CONFIG": os.devnull,
                "BURST_ENDPOINT_URL": endpoint, "BURST_ADDRESSING_STYLE": "path",
                "BURST_NODE_GPU": "cpu", "BURST_OFFLINE": "1", "PYTHONHASHSEED": "0",
                "BURST_STUB_SEAL": "require", "BURST_STUB_ROOT": str(nodes),
                "BURST_WHEELS_TORCH": "cpu"})  # the stub node is a CPU: its torch build
    return env


def sees(project: Path) -> list[str]:
    """What the node must not see: burst's source tree, the project (the run's source),
    its local store, the user's venv and interpreter, this machine's HOME."""
    return [str(ROOT), str(ROOT / "burst"), str(project), str(project / ".burst"),
            sys.prefix, os.path.realpath(PY), os.path.expanduser("~")]



@pytest.fixture(scope="session")
def sealed_reference(tmp_path_factory) -> tuple[list[dict], dict]:
    """The same project trained without a stop, on a local store: (step records, final state)."""
    project = make_project(tmp_path_factory.mktemp("reference") / "project")
    done = subprocess.run([PY, "train.py", "--run-id", "reference", "--store",
                           str(project / ".burst"), *ARGS], cwd=project, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    import torch

    return (step_records(project / "records.jsonl"),
            torch.load(project / "final.pt", weights_only=True))


@pytest.fixture(scope="session")
def sealed_wheel_cache(tmp_path_factory) -> Path:
    """One wheel cache for the session: every wheel is repacked once
    (``BURST_TEST_WHEEL_CACHE`` keeps one between local runs)."""
    kept = os.environ.get("BURST_TEST_WHEEL_CACHE")
    return Path(kept) if kept else tmp_path_factory.mktemp("wheel-cache")


def kill_then_resume(project: Path, url: str, run_id: str, env: dict[str, str], fault: str,
                     train_args: tuple[str, ...], node_args: tuple[str, ...] = (),
                     to: str = "local", resume_args: tuple[str, ...] = ()
                     ) -> subprocess.CompletedProcess:
    """Train ``train.py`` until ``fault`` SIGKILLs it, then ``burst resume --to TO`` (the
    local stub's sealed node, or a sealed box's ``ssh://`` URL, with ``resume_args`` such as
    its keys) with the same command (plus ``node_args``); the resume's result."""
    killed = subprocess.run([PY, "train.py", "--run-id", run_id, "--store", url, *train_args],
                            cwd=project, capture_output=True, text=True, timeout=600,
                            check=False, env={**env, "BURST_FAULT": fault,
                                              "BURST_LOCAL": str(project / ".burst")})
    assert killed.returncode == -9, killed.stderr[-3000:]
    return subprocess.run([PY, "-m", "burst.cli", "resume", run_id, "--to", to, "--store",
                           url, "--local", str(project / ".burst"), *resume_args, "--",
                           "python", "train.py", *train_args, *node_args],
                          cwd=project, capture_output=True, text=True, timeout=1800,
                          check=False, env=env)


def assert_resumed_bitwise(code: Path, project: Path, reference: tuple[list[dict], dict]) -> None:
    """The node's final state equals the uninterrupted run's, and the step records of the
    killed leg and the resumed one stitch into the uninterrupted run's records."""
    import torch

    assert_same(torch.load(code / "final.pt", weights_only=True), reference[1])
    before = step_records(project / "records.jsonl")
    after = step_records(code / "records.jsonl")
    stitched = {r["step"]: r for r in before} | {r["step"]: r for r in after}
    assert [stitched[k] for k in sorted(stitched)] == reference[0]
    assert not (project / "final.pt").exists()  # the killed leg never finished here


def assert_saw_nothing(code: Path, hidden: list[str]) -> None:
    """None of ``hidden`` existed for the training script on the node."""
    seen = json.loads((code / "seen.json").read_text())
    assert seen["paths"] == {path: False for path in hidden}


def assert_trained_in_node_venv(code: Path) -> None:
    """burst and torch ran from the node's one venv (built from the store), not this one."""
    seen = json.loads((code / "seen.json").read_text())
    venv = code.parent / "venv"
    assert Path(seen["prefix"]) == venv
    assert Path(seen["burst"]).is_relative_to(venv) and Path(seen["torch"]).is_relative_to(venv)

"""A ``BURST_FAULT`` fires once per run: set in the shell, it used to fire again in every
retry of ``burst run`` (retry-smaller went 8 -> 4 -> 2 -> 1 and gave up). ``+always``
keeps the old behaviour for a drill that wants it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.contract import ENV_FAULT
from burst.errors import ConfigError
from burst.store import LocalStore
from burst.training import faults
from tests.conftest import EXAMPLE


@pytest.fixture(autouse=True)
def no_freeze(monkeypatch):
    monkeypatch.setenv("BURST_FREEZE", "0")  # the environment record plays no part here


def test_always_is_the_one_option_a_fault_takes():
    assert faults.parse("oom@3+always,kill@4/1") == [
        faults.Fault("oom", 3, 0, None, always=True), faults.Fault("kill", 4, 0, 1)]
    with pytest.raises(ConfigError, match=r"\+always"):
        faults.parse("oom@3+twice")


def _first_step(store: LocalStore) -> None:
    """A fresh process of run ``once`` (a new Run), taking its first step."""
    data = TensorDataset(torch.ones(8, 2), torch.zeros(8))
    run = burst.Run("once", store=store, global_batch=4, micro_batch=4)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    try:
        for step in run.steps(DataLoader(data, batch_size=4,
                                          sampler=burst.ResumableSampler(data))):
            for x, _ in step:
                model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            break
    finally:
        run.close()


def test_a_fault_that_fired_is_left_out_by_the_runs_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAULT, "oom@1")
    store = LocalStore(tmp_path / "store")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        _first_step(store)
    _first_step(store)  # the same BURST_FAULT, the same step: trains on
    fired = [e for e in events.read(store, "once") if e["event"] == faults.FIRED_EVENT]
    assert [e["fault"] for e in fired] == ["oom@1:0"]


def test_a_fault_marked_always_fires_in_every_process(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAULT, "oom@1+always")
    store = LocalStore(tmp_path / "store")
    for _ in range(2):
        with pytest.raises(torch.cuda.OutOfMemoryError):
            _first_step(store)


@pytest.mark.e2e
def test_burst_run_retries_a_shell_fault_once_and_finishes(tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "burst.cli", "run", "--run-id", "shell-fault", "--store",
           str(store), "--", sys.executable, str(EXAMPLE), "--samples", "32", "--epochs", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, ENV_FAULT: "oom@2"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    history = events.read(LocalStore(store), "shell-fault")
    starts = [e for e in history if e["event"] == "child-start"]
    assert [e["micro_batch"] for e in starts] == [None, 4]  # one retry, at half the micro-batch
    assert len([e for e in history if e["event"] == faults.FIRED_EVENT]) == 1

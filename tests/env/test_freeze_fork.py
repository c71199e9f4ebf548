"""The freeze runs ``git`` in a thread of the training process while DataLoader workers
``fork``: a worker forked at the wrong moment once inherited a pipe ``subprocess`` waited
on, and the run hung for good. Here workers are forked (``os.fork``, as DataLoader does)
over and over while the freeze runs, and each fork lives on until the end, as workers do:
every freeze must still finish. And a freeze that does hang never holds up a snapshot."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst.env import codearchive, freeze
from burst.snapshot import reader
from burst.staging import spawn
from burst.store import LocalStore, MemoryStore
from tests.helpers.env_helpers import make_repo, write

ROUNDS = 8
FORKS_PER_ROUND = 40  # at most: each lives until the end of the test
BOUND_S = 30.0  # a freeze of a tiny repository that takes longer than this has hung


@pytest.fixture(scope="module", autouse=True)
def fresh_cache():
    """Once for the module: the tests use their own stores, so they share the lockfile
    the first one builds (seconds) and never each other's freeze."""
    freeze.reset_cache()
    yield
    freeze.reset_cache()


@pytest.fixture(autouse=True)
def freeze_on(monkeypatch):
    monkeypatch.delenv(freeze.FREEZE_ENV, raising=False)


class Workers:
    """Forked children that live until released, like DataLoader workers: they keep every
    descriptor they inherited open until they exit."""

    def __init__(self) -> None:
        self.release_r, self.release_w = os.pipe()
        self.pids: list[int] = []

    def fork(self) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: wait for the release, then leave without cleanup
            try:
                os.close(self.release_w)
                os.read(self.release_r, 1)
            finally:
                os._exit(0)
        self.pids.append(pid)

    def release(self) -> None:
        os.close(self.release_w)
        os.close(self.release_r)
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


@pytest.mark.timeout(240)
def test_the_freeze_always_finishes_while_workers_fork_around_it(tmp_path, monkeypatch):
    monkeypatch.chdir(make_repo(tmp_path / "repo"))
    store = MemoryStore("freeze-fork")
    freeze.freeze_run(store, "warm-up")  # the lockfile, built once per process
    workers = Workers()
    hung = []
    try:
        for round_ in range(ROUNDS):
            run_id = f"fork-{round_}"
            thread = threading.Thread(target=freeze.freeze_run, args=(store, run_id),
                                      name="burst-freeze", daemon=True)
            thread.start()
            for _ in range(FORKS_PER_ROUND):
                workers.fork()
                time.sleep(0.002)  # leave the freeze thread the GIL now and then
                if not thread.is_alive():
                    break
            thread.join(BOUND_S)
            if thread.is_alive():
                hung.append(round_)
                break
            assert freeze.freeze_run(store, run_id).code_ref is not None
    finally:
        workers.release()
    assert not hung, f"the freeze hung in round {hung[0]} ({len(workers.pids)} forks)"


@pytest.mark.timeout(60)
def test_a_timed_out_helper_is_killed_and_reported():
    done = spawn.run(["sleep", "30"], timeout=0.2)  # the 60 s bound fails it if not killed
    assert done.returncode is None


def _hanging_git(tmp_path: Path, release: Path) -> Path:
    """A ``git`` that hangs until ``release`` exists, then runs the real one."""
    real = shutil.which("git")
    assert real
    bin_dir = tmp_path / "bin"
    script = write(bin_dir, "git", f'#!/bin/sh\nwhile [ ! -e "{release}" ]; do sleep 0.02; done\n'
                                   f'exec "{real}" "$@"\n')
    script.chmod(0o755)
    return bin_dir


def _step(run: burst.Run, model: torch.nn.Module, opt: torch.optim.Optimizer,
          loader: DataLoader) -> None:
    for step in run.steps(loader):
        for x, _ in step:
            model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        break


@pytest.mark.timeout(120)
def test_a_snapshot_goes_ahead_while_git_hangs_and_a_later_one_names_the_code(tmp_path,
                                                                            monkeypatch):
    release = tmp_path / "release"
    project = tmp_path / "project"
    write(project, "train.py", "x = 1\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("PATH", f"{_hanging_git(tmp_path, release)}:{os.environ['PATH']}")
    monkeypatch.setattr(freeze, "SNAPSHOT_WAIT_SECONDS", 0.5)
    store = LocalStore(tmp_path / "store")
    data = TensorDataset(torch.arange(16, dtype=torch.float32).reshape(8, 2), torch.arange(8))
    run = burst.Run("hung-git", store=store, global_batch=2, micro_batch=2, persist_every=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    loader = DataLoader(data, batch_size=2, sampler=burst.ResumableSampler(data))
    try:
        _step(run, model, opt, loader)  # persists step 1 while git hangs
        run.flush(timeout=60)
        first = reader.read_manifest(store, "hung-git", 1)
        assert first["freeze"] == "pending" and first["code_ref"] is None
    finally:
        release.touch()
    done = freeze.freeze_run(store, "hung-git")  # the freeze thread's result, once done
    assert done.code_ref is not None and not done.pending
    _step(run, model, opt, loader)
    run.flush(timeout=60)
    second = reader.read_manifest(store, "hung-git", 2)
    assert second["code_ref"] == done.code_ref and "freeze" not in second
    assert freeze.wait_uploads(60)
    assert codearchive.latest_ref(store, "hung-git") == done.code_ref

"""The automatic freeze: the first snapshot of a run names its lockfile and code archive,
later ones reuse them, and a failure to freeze never stops training."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.env import codearchive, freeze, lockfile
from burst.snapshot import reader
from burst.store import LocalStore, MemoryStore
from tests.helpers.env_helpers import make_repo


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.delenv(freeze.FREEZE_ENV, raising=False)
    freeze.reset_cache()
    yield
    freeze.reset_cache()


def _train(store, steps: int = 2) -> burst.Run:
    data = TensorDataset(torch.arange(16, dtype=torch.float32).reshape(8, 2), torch.arange(8))
    run = burst.Run("frz", store=store, global_batch=2, micro_batch=2, shadow_every=1,
                    persist_every=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    loader = DataLoader(data, batch_size=2, sampler=burst.ResumableSampler(data, seed=1))
    for epoch_steps in run.epochs(1):
        del epoch_steps
        for step in run.steps(loader):
            for x, _ in step:
                model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if step.index == steps:
                break
    run.flush()
    return run


def test_first_snapshot_records_the_lockfile_hash_and_code_ref(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    store = LocalStore(tmp_path / "store")
    _train(store)
    assert freeze.wait_uploads(60)
    manifest = reader.read_manifest(store, "frz")
    digest, ref = manifest["lockfile_hash"], manifest["code_ref"]
    assert lockfile.load(store, "frz", digest).package("torch") is not None
    assert ref["git"]["branch"] == "main" and ".env" in ref["skipped"]
    assert store.size(codearchive.archive_key("frz", ref["archive"])) is not None


def test_later_snapshots_reuse_the_first_freeze(monkeypatch):
    calls = []
    real = lockfile.build
    monkeypatch.setattr(lockfile, "build", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv(freeze.FREEZE_ENV, "env")
    store = MemoryStore("freeze-cache")
    first = freeze.freeze_run(store, "r")
    assert freeze.freeze_run(store, "r") is first
    assert freeze.freeze_run(store, "other-run").lockfile_hash == first.lockfile_hash
    assert len(calls) == 1 and first.code_ref is None


def test_a_failed_freeze_warns_records_an_event_and_training_goes_on(tmp_path, monkeypatch):
    def too_large(*_, **__):
        raise codearchive.CodeTooLarge("the code to archive is 900.0 MiB, over the cap")

    monkeypatch.setattr(codearchive, "capture", too_large)
    monkeypatch.chdir(tmp_path)
    store = LocalStore(tmp_path / "store")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _train(store, steps=2)
        freeze.wait_uploads(60)
    assert run.step == 2
    manifest = reader.read_manifest(store, "frz")
    assert manifest["lockfile_hash"] and manifest["code_ref"] is None
    assert any(issubclass(w.category, freeze.FreezeWarning) and "900.0 MiB" in str(w.message)
               for w in caught)
    failed = [e for e in events.read(store, "frz") if e["event"] == "freeze-failed"]
    assert len(failed) == 1 and failed[0]["what"] == "code"


def test_freeze_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(freeze.FREEZE_ENV, "0")
    store = MemoryStore("freeze-off")
    assert freeze.freeze_run(store, "r") == freeze.FreezeResult(None, None)
    assert store.list("r/") == []


def test_a_slow_store_never_blocks_the_training_thread(tmp_path, monkeypatch):
    release = threading.Event()

    class SlowStore(MemoryStore):
        def put(self, key, data):
            release.wait(30)
            super().put(key, data)

        def put_if_absent(self, key, data):
            release.wait(30)
            return super().put_if_absent(key, data)

    monkeypatch.chdir(make_repo(tmp_path / "repo"))
    store = SlowStore("freeze-slow")
    started = time.monotonic()
    result = freeze.freeze_run(store, "r")
    assert time.monotonic() - started < 10 and result.lockfile_hash and result.code_ref
    assert store.size(lockfile.key("r", result.lockfile_hash)) is None  # still uploading
    release.set()
    assert freeze.wait_uploads(30)
    assert lockfile.load(store, "r", result.lockfile_hash).digest == result.lockfile_hash

"""``attach`` checks everything a snapshot constrains before it restores or records
anything: restoring into a dataset of another length used to be caught only at
``run.steps()``, after ``attach`` had recorded a resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.errors import SnapshotError
from burst.store import LocalStore


@pytest.fixture(autouse=True)
def no_freeze(monkeypatch):
    monkeypatch.setenv("BURST_FREEZE", "0")  # the environment record plays no part here


def _data(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(2 * n, dtype=torch.float32).reshape(n, 2), torch.zeros(n))


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture
def store(tmp_path) -> LocalStore:
    """Run ``data`` after two steps over 8 samples, snapshotted."""
    store = LocalStore(tmp_path / "store")
    data = _data(8)
    run = burst.Run("data", store=store, global_batch=2, micro_batch=2, persist_every=1)
    model, opt = _model()
    run.attach(model, opt)
    loader = DataLoader(data, batch_size=2, sampler=burst.ResumableSampler(data, seed=3))
    for step in run.steps(loader):
        for x, _ in step:
            model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if step.index == 2:
            break
    run.close()
    return store


def _history(store: LocalStore) -> list[str]:
    return [e["event"] for e in events.read(store, "data")]


def test_attach_refuses_another_dataset_length_before_restoring_or_recording(store):
    before = _history(store)
    run = burst.Run("data", store=store, global_batch=2, micro_batch=2)
    model, opt = _model()
    untouched = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(SnapshotError, match="num_samples was 8, now 12"):
        run.attach(model, opt, sampler=burst.ResumableSampler(_data(12), seed=3))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), untouched, strict=True))
    assert run.step == 0 and _history(store) == before


def test_attach_refuses_another_sampler_seed(store):
    run = burst.Run("data", store=store, global_batch=2, micro_batch=2)
    with pytest.raises(SnapshotError, match="seed was 3, now 4"):
        run.attach(*_model(), sampler=burst.ResumableSampler(_data(8), seed=4))


def test_without_a_sampler_the_resume_is_recorded_only_once_the_data_checks_out(store):
    before = _history(store)
    run = burst.Run("data", store=store, global_batch=2, micro_batch=2)
    run.attach(*_model())
    wrong = _data(12)
    with pytest.raises(SnapshotError, match="num_samples"):
        next(run.steps(DataLoader(wrong, batch_size=2,
                                  sampler=burst.ResumableSampler(wrong, seed=3))))
    assert _history(store) == before
    right = _data(8)
    run.adopt_sampler(burst.ResumableSampler(right, seed=3))
    assert _history(store) == [*before, "resume"]

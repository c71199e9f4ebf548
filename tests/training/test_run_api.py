"""The Run API in one process: restore-or-start, layout rules, AMP rules, step boundaries."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst.errors import ConfigError, SnapshotError
from burst.snapshot import reader
from burst.store import LocalStore

DATA = TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20))


def make_model(width: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, width), torch.nn.Linear(width, 1))


def train(run: burst.Run, model, optimizer, epochs: int = 1, stop_after: int | None = None
          ) -> list[list[int]]:
    """Train, returning the sample indices (targets here) of each optimizer step."""
    loader = DataLoader(DATA, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(DATA, seed=1))
    seen = []
    for _epoch in run.epochs(epochs):
        for step in run.steps(loader):
            indices = []
            for x, y in step:
                (model(x).sum() * step.weight(len(x))).backward()
                indices += y.tolist()
            optimizer.step()
            optimizer.zero_grad()
            seen.append(indices)
            if stop_after is not None and step.index == stop_after:
                return seen
    return seen


def new_run(tmp_path, **kwargs) -> burst.Run:
    kwargs.setdefault("global_batch", 4)
    kwargs.setdefault("micro_batch", 2)
    return burst.Run("r", store=tmp_path, **kwargs)


def test_a_fresh_run_starts_and_a_second_one_restores(tmp_path):
    run = new_run(tmp_path)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert run.attach(model, opt) is None
    train(run, model, opt, stop_after=2)
    run.snapshot(wait=True)
    again = new_run(tmp_path)
    model2 = make_model()
    report = again.attach(model2, torch.optim.SGD(model2.parameters(), lr=0.1))
    assert report is not None and report.step == 2 and again.samples_consumed == 8
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  model2.state_dict().values(), strict=True))


def test_restoring_into_a_different_shape_names_the_tensor_and_changes_nothing(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model(4))
    run.snapshot(wait=True)
    model = make_model(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SnapshotError, match=r"'0.weight'"):
        new_run(tmp_path).attach(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_corrupt_blob_restores_nothing(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    run.snapshot(wait=True)
    for path in (tmp_path / "r" / "blobs").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0" + path.read_bytes()[1:])
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SnapshotError, match="corrupt"):
        new_run(tmp_path).attach(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def adam_with_equal_moments() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Two layers of 1 MiB (each its own blob) whose Adam moments are equal, all zero:
    the snapshot stores those bytes once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False),
                                torch.nn.Linear(512, 512, bias=False))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    return model, optimizer


def step_with_distinct_grads(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for scale, parameter in enumerate(model.parameters(), start=1):
        parameter.grad = torch.full_like(parameter, float(scale))
    optimizer.step()


def snapshot_and_restore(tmp_path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                         ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Snapshot ``model`` and ``optimizer``; restore a fresh pair from it, as a restart would."""
    run = new_run(tmp_path)
    run.attach(model, optimizer)
    run.snapshot(wait=True)
    resumed_model, resumed_optimizer = adam_with_equal_moments()
    new_run(tmp_path).attach(resumed_model, resumed_optimizer)
    return resumed_model, resumed_optimizer


def test_a_restored_optimizer_whose_moments_were_equal_trains_as_if_never_stopped(tmp_path):
    model, optimizer = adam_with_equal_moments()
    resumed_model, resumed_optimizer = snapshot_and_restore(tmp_path, model, optimizer)
    step_with_distinct_grads(model, optimizer)
    step_with_distinct_grads(resumed_model, resumed_optimizer)
    for expected, actual in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(expected, actual)


def test_training_after_a_restore_leaves_the_snapshot_it_came_from_intact(tmp_path):
    model, optimizer = adam_with_equal_moments()
    resumed_model, resumed_optimizer = snapshot_and_restore(tmp_path, model, optimizer)
    step_with_distinct_grads(resumed_model, resumed_optimizer)  # writes the moments in place
    assert reader.verify(LocalStore(tmp_path), "r")["step"] == 0


def mapped_files(address: int) -> list[str]:
    """The files mapped at ``address`` in this process (Linux's /proc/self/maps)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end and len(fields) > 5:
                found.append(fields[5])
    return found


def test_a_restored_optimizers_host_state_does_not_stay_in_the_snapshots_files(tmp_path):
    model, optimizer = adam_with_equal_moments()
    step_with_distinct_grads(model, optimizer)  # moments of their own, one blob each
    _, resumed_optimizer = snapshot_and_restore(tmp_path, model, optimizer)
    addresses = [value.data_ptr() for values in resumed_optimizer.state.values()
                 for value in values.values() if value.dim()]
    assert len(addresses) == 4
    assert not [f for a in addresses for f in mapped_files(a) if str(tmp_path) in f]


def test_the_global_batch_is_never_changed_silently(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    run.snapshot(wait=True)
    with pytest.raises(SnapshotError, match="global batch is 4"):
        new_run(tmp_path, global_batch=8).attach(make_model())


def test_a_new_micro_batch_keeps_every_steps_samples(tmp_path, monkeypatch):
    reference_run = burst.Run("ref", store=tmp_path, global_batch=4, micro_batch=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_run.attach(model, opt)
    expected = train(reference_run, model, opt, epochs=2)

    first = new_run(tmp_path)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first.attach(model, opt)
    seen = train(first, model, opt, epochs=2, stop_after=3)
    first.snapshot(wait=True)
    monkeypatch.setenv("BURST_MICRO_BATCH", "1")  # what a plan for a smaller card sets
    second = new_run(tmp_path)
    assert (second.micro_batch, second.accumulation) == (1, 4)
    report = second.attach(model, opt)
    assert "micro-batch 2 -> 1" in str(report)
    seen += train(second, model, opt, epochs=2)
    assert seen == expected


def test_a_micro_batch_that_does_not_divide_the_global_batch_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a multiple"):
        new_run(tmp_path, global_batch=10, micro_batch=4)


def test_a_snapshot_asked_for_mid_step_is_taken_at_the_step_boundary(tmp_path):
    run = new_run(tmp_path, shadow_every=100, persist_seconds=None)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    loader = DataLoader(DATA, batch_size=2, sampler=burst.ResumableSampler(DATA))
    for step in run.steps(loader):
        for x, _ in step:
            run.snapshot("manual")
            model(x).sum().backward()
        opt.step()
        break
    run.flush()
    manifest = reader.read_manifest(run.store, "r")
    assert manifest["step"] == 1 and manifest["counters"]["samples_consumed"] == 4


def test_a_step_must_consume_all_its_micro_batches(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    loader = DataLoader(DATA, batch_size=2, sampler=burst.ResumableSampler(DATA))
    with pytest.raises(ConfigError, match="used 1 of its 2 micro-batches"):
        for step in run.steps(loader):
            next(iter(step))


def test_the_loader_must_use_the_runs_micro_batch_and_a_resumable_sampler(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    with pytest.raises(ConfigError, match=r"batch_size=run\.micro_batch"):
        next(run.steps(DataLoader(DATA, batch_size=3, sampler=burst.ResumableSampler(DATA))))
    with pytest.raises(ConfigError, match="ResumableSampler"):
        next(run.steps(DataLoader(DATA, batch_size=2, shuffle=True)))


def test_every_rng_and_the_extra_dict_are_restored(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    run.extra["best"] = 0.5
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    run.snapshot(wait=True)
    expected = (random.random(), np.random.rand(), torch.rand(2))
    again = new_run(tmp_path)
    again.attach(make_model())
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(2), expected[2])
    assert again.extra == {"best": 0.5}


def test_the_data_must_match_the_snapshots(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    loader = DataLoader(DATA, batch_size=2, sampler=burst.ResumableSampler(DATA, seed=1))
    next(run.steps(loader))
    run.snapshot(wait=True)
    again = new_run(tmp_path)
    again.attach(make_model())
    other = DataLoader(DATA, batch_size=2, sampler=burst.ResumableSampler(DATA, seed=2))
    with pytest.raises(SnapshotError, match="sampler seed was 1, now 2"):
        next(again.steps(other))


class BlockingStore(LocalStore):
    def __init__(self, root, release: threading.Event) -> None:
        super().__init__(root)
        self.release, self.entered = release, threading.Event()

    def put(self, key, data):
        if "/events" not in key:
            self.entered.set()
            assert self.release.wait(10)
        super().put(key, data)


def test_persisting_runs_in_the_background(tmp_path):
    release = threading.Event()
    store = BlockingStore(tmp_path, release)
    run = burst.Run("r", store=store, global_batch=4)
    run.attach(make_model())
    run.snapshot()  # returns although the store is blocked
    assert store.entered.wait(10)
    assert reader.list_steps(LocalStore(tmp_path), "r") == []
    release.set()
    run.flush()
    assert reader.list_steps(LocalStore(tmp_path), "r") == [0]


class BrokenStore(LocalStore):
    def put(self, key, data):
        if "/events" not in key:
            raise OSError("No space left on device")
        super().put(key, data)


def test_a_failed_persist_is_reported_at_flush_and_keeps_the_previous_snapshot(tmp_path):
    run = new_run(tmp_path)
    run.attach(make_model())
    run.snapshot(wait=True)
    broken = burst.Run("r", store=BrokenStore(tmp_path), global_batch=4, micro_batch=2)
    broken.attach(make_model())
    broken.snapshot()
    with pytest.raises(SnapshotError, match="No space left"):
        broken.flush()
    assert reader.list_steps(LocalStore(tmp_path), "r") == [0]


def test_a_run_id_that_could_escape_the_store_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="run id"):
        burst.Run("../x", store=tmp_path, global_batch=1)


def test_a_plan_whose_accumulation_disagrees_with_this_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("BURST_MICRO_BATCH", "1")
    monkeypatch.setenv("BURST_ACCUMULATION", "2")
    with pytest.raises(ConfigError, match=r"BURST_ACCUMULATION=2.*has 4"):
        new_run(tmp_path)


def test_snapshots_record_the_total_steps_of_the_run(tmp_path):
    run = new_run(tmp_path)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    train(run, model, opt, epochs=3, stop_after=1)
    run.snapshot(wait=True)
    assert reader.read_manifest(run.store, "r")["counters"]["total_steps"] == 15


def test_the_runs_grad_scaler_is_enabled_only_for_fp16(tmp_path):
    run = new_run(tmp_path, amp="fp16")
    run.attach(make_model())
    assert run.grad_scaler().is_enabled()
    bf16 = burst.Run("b", store=tmp_path, global_batch=4, amp="bf16")
    bf16.attach(make_model())
    assert not bf16.grad_scaler().is_enabled()


def test_a_run_may_not_take_the_name_of_the_stores_shared_wheelhouse(tmp_path):
    with pytest.raises(ConfigError, match="keeps for itself"):
        burst.Run("wheels", global_batch=4, store=tmp_path / "store")

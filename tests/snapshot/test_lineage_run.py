"""A Run whose launch a newer one replaced: its snapshot is refused and it stops (exit 90)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.contract import Exit
from burst.snapshot import reader
from burst.snapshot.lineage import FencedError
from burst.store import LocalStore

DATA = TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20))


def launch(store_dir) -> tuple[burst.Run, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run("r", global_batch=4, micro_batch=2, store=store_dir, persist_seconds=None)
    run.attach(model, optimizer)
    return run, model, optimizer


def train(run: burst.Run, model, optimizer, steps: int) -> None:
    loader = DataLoader(DATA, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(DATA, seed=1))
    done = 0
    for _ in run.epochs(1):
        for step in run.steps(loader):  # the previous step ends (and may stop) in next()
            if done == steps:
                return
            for x, _y in step:
                (model(x).sum() * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1


def test_a_replaced_run_on_a_local_store_is_refused_then_stops_with_exit_90(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("BURST_FREEZE", "0")  # the environment freeze is not under test here
    a, model_a, opt_a = launch(tmp_path)
    train(a, model_a, opt_a, steps=2)
    a.snapshot(wait=True)
    b, model_b, opt_b = launch(tmp_path)  # the burst's node: resumes from A's step 2
    assert b.restored is not None and b.restored.step == 2
    train(a, model_a, opt_a, steps=1)
    with pytest.raises(FencedError):
        a.snapshot(wait=True)
    with pytest.raises(SystemExit) as stopped:
        train(a, model_a, opt_a, steps=1)
    assert stopped.value.code == Exit.FENCED
    store = LocalStore(tmp_path)
    assert reader.list_steps(store, "r") == [2]
    fenced = [e for e in events.read(store, "r") if e.get("event") == "fenced"]
    assert [(e["generation"], e["newer"]) for e in fenced] == [(1, 2)]
    train(b, model_b, opt_b, steps=2)
    b.close()
    newest = reader.read_manifest(store, "r")
    assert newest["step"] == 4 and newest["generation"] == 2

"""The per-step path kept cheap without giving up exactness: generator keys stored as
tensors yet old snapshots restore, buffers rewound through preallocated copies, and the
ranks' per-step vote that never stalls."""

from __future__ import annotations

import os
import random
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import burst
from burst.contract import ENV_FAULT
from burst.env.freeze import FREEZE_ENV
from burst.parallel.group import Group, StepVote
from burst.snapshot import tree
from burst.snapshot.tiers import Captured, write_snapshot
from burst.state import capture as state_mod
from burst.store import LocalStore


class Normed(torch.nn.Module):
    """BatchNorm statistics move in the forward pass; ``seen`` is re-assigned each time."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)
        self.head = torch.nn.Linear(3, 1)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.seen + len(x)  # a new tensor: the registration hook notices
        return self.head(self.norm(x))


def one_step(run: burst.Run, model: torch.nn.Module, optimizer, x: torch.Tensor) -> None:
    run.begin_step()
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    run.end_step(len(x))


def trained(tmp_path, run_id: str, shadow_every: int) -> tuple[burst.Run, Normed, dict]:
    """A run of ``Normed`` three steps in, and its model's state at that boundary."""
    torch.manual_seed(0)
    model = Normed()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run(run_id, store=tmp_path / "store", global_batch=4,
                    shadow_every=shadow_every, persist_seconds=None)
    run.attach(model, optimizer)
    for _ in range(3):
        one_step(run, model, optimizer, torch.randn(4, 3))
    return run, model, {k: v.clone() for k, v in model.state_dict().items()}


def assert_newest_holds(tmp_path, run_id: str, expected: dict[str, torch.Tensor]) -> None:
    manifest = state_mod.decode(*_newest(tmp_path / "store", run_id))
    for name, value in expected.items():
        assert torch.equal(manifest["model"][name], value), name


def test_an_oom_mid_step_saves_the_buffers_of_the_step_boundary(tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")  # no environment freeze: not what this is about
    monkeypatch.setenv(ENV_FAULT, "oom@4")  # a CPU runs out of CUDA memory in drills
    run, model, boundary = trained(tmp_path, "bn", shadow_every=1000)
    run.begin_step()
    model(torch.randn(4, 3) * 5)  # the forward of a step that then runs out of memory
    assert not torch.equal(model.norm.running_mean, boundary["norm.running_mean"])
    assert run.rescue.save_boundary("oom") == 3
    run.flush()
    assert_newest_holds(tmp_path, "bn", boundary)


def test_without_cuda_or_a_drill_an_oom_save_keeps_the_ram_shadow_of_the_boundary(
        tmp_path, monkeypatch):
    """A process that never used CUDA marks no boundary (nothing it runs can raise a CUDA
    OOM); should one come, the save falls back on the RAM shadow, never on mid-step state."""
    monkeypatch.setenv(FREEZE_ENV, "0")
    monkeypatch.delenv(ENV_FAULT, raising=False)
    run, model, shadowed = trained(tmp_path, "cpu", shadow_every=3)  # step 3's shadow
    one_step(run, model, run.components.optimizer, torch.randn(4, 3))
    run.begin_step()
    model(torch.randn(4, 3) * 5)
    assert run.rescue.save_boundary("oom") == 3
    run.flush()
    assert_newest_holds(tmp_path, "cpu", shadowed)


def test_a_snapshot_with_the_older_list_keys_resumes_exactly(tmp_path):
    store = LocalStore(tmp_path / "store")
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    model = torch.nn.Linear(2, 1)
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    older = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
    tensors: dict[str, torch.Tensor] = {}
    state = {"model": model.state_dict(), "optimizer": None, "scheduler": None,
             "scaler": None, "rng": older, "extra": {}}
    encoded = tree.encode(state, "state", tensors)
    meta = {"reason": "periodic", "counters": {"step": 4, "epoch": 0, "samples_consumed": 8,
                                               "samples_in_epoch": 8},
            "batch": {"global": 2, "micro": 2, "accumulation": 1, "world_size": 1}}
    write_snapshot(store, "old", Captured(4, encoded, tensors, meta))
    expected = (random.random(), float(np.random.rand()), torch.rand(2).tolist())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    run = burst.Run("old", store=store, global_batch=2, persist_seconds=None)
    report = run.attach(torch.nn.Linear(2, 1))
    assert report is not None and report.step == 4
    assert (random.random(), float(np.random.rand()), torch.rand(2).tolist()) == expected


def _newest(root, run_id: str) -> tuple[dict, dict[str, torch.Tensor]]:
    from burst.snapshot import reader
    from burst.snapshot.tensors import load_tensors

    store = LocalStore(root)
    manifest = reader.read_manifest(store, run_id)
    return manifest, load_tensors(store, manifest)


def _vote_worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        vote = StepVote(Group.current())
        decided = []
        # boundary 1: rank 1 has a reason; boundary 2: rank 0 wants a shadow; 3: nothing
        for own in [(False, False, "signal" if rank == 1 else None),
                    (False, rank == 0, None), (False, False, None)]:
            decided.append(vote.collect())
            vote.cast(*own)
        decided.append(vote.collect())
        results.put((rank, decided))
    finally:
        dist.destroy_process_group()


def test_ranks_act_on_the_same_votes_one_boundary_after_they_were_cast():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("fork")  # torch is loaded already: no second import
    results = context.Queue()
    ranks = [context.Process(target=_vote_worker, args=(rank, port, results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    decided = dict(results.get(timeout=60) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
    expected = [(False, False, None), (True, False, "signal"), (False, True, None),
                (False, False, None)]
    assert decided[0] == decided[1] == expected

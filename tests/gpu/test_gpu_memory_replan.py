"""The in-process re-plan under real memory pressure: the allocator is capped
(``set_per_process_memory_fraction``) just above what the planned micro-batch needs, the
default CUDA reader sees the step's peak pass the target, and the run shrinks its
micro-batch at the next boundary: no OOM, the same samples, losses within float error."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from tests.gpu.common import MARKS

pytestmark = MARKS

WIDTH, DEPTH, BATCH = 1024, 8, 4096  # activations dominate: about 64 KiB per sample
DATA = TensorDataset(torch.randn(BATCH * 4, WIDTH, generator=torch.Generator().manual_seed(1)),
                     torch.arange(BATCH * 4))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [m for _ in range(DEPTH) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers).cuda()


def probe() -> tuple[int, int]:
    """Peak allocated and reserved bytes of one step at the planned micro-batch."""
    gc.collect()  # the reference run's model and its cycles
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    net = model()
    net(DATA.tensors[0][:BATCH].cuda()).square().mean().backward()
    torch.cuda.synchronize()
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    del net
    torch.cuda.empty_cache()
    return peaks


def train(tmp_path, name: str, **kwargs) -> tuple[list, list, list]:
    """Two epochs; the run's memory-replan events, each step's samples and loss."""
    run = burst.Run(name, store=tmp_path / name, global_batch=BATCH, micro_batch=BATCH,
                    persist_seconds=None, **kwargs)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    run.attach(net, opt)
    loader = DataLoader(DATA, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(DATA, seed=2))
    seen, losses = [], []
    for _ in run.epochs(2):
        for step in run.steps(loader):
            indices, total = [], 0.0
            for x, index in step:
                loss = net(x.cuda()).square().mean() * step.weight(len(x))
                loss.backward()
                indices += index.tolist()
                total += loss.item()
            opt.step()
            opt.zero_grad()
            seen.append(indices)
            losses.append(total)
    run.close()
    changes = [e for e in events.read(run.local, name) if e["event"] == "memory-replan"]
    return changes, seen, losses


@pytest.fixture
def capped():
    """Cap this process's allocator; give the card back afterwards."""
    def cap(limit: int) -> None:
        torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.mem_get_info()[1])
    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def test_real_memory_pressure_shrinks_the_micro_batch_without_an_oom(tmp_path, capped):
    _, ref_seen, ref_losses = train(tmp_path, "plain", memory_target=None)
    allocated, reserved = probe()
    limit = int(reserved * 1.05) + (64 << 20)  # room for the step, not much more
    capped(limit)
    torch.cuda.reset_peak_memory_stats()
    target = 0.9 * allocated / limit  # the planned micro-batch's peak passes it
    changes, seen, losses = train(tmp_path, "capped", memory_target=target)
    assert torch.cuda.max_memory_reserved() <= limit
    assert changes and changes[0]["reason"] == "over-target" and changes[0]["step"] == 1
    assert changes[0]["old_micro"] == BATCH and changes[0]["new_micro"] < BATCH
    assert changes[0]["total_bytes"] <= limit + 1
    assert seen == ref_seen
    assert losses == pytest.approx(ref_losses, rel=1e-3)

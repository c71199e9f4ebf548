"""The example training loop on any number of ranks: plain, DDP or FSDP2; the scale-out
tests run it in one process or under ``python -m torch.distributed.run``.

Each rank appends, per optimizer step, the sample indices it consumed, its share of the
loss (bits) and one draw from its torch generator (bits) to ``<records>.rank<R>``, one
flushed JSON line per step, so a SIGKILL loses nothing already recorded. The final
model and optimizer state is the run's last snapshot (``run.close()``), which holds them
in the same layout whatever the world size, so runs on different world sizes compare
directly.

For the sharded-snapshot tests and measurements:

- ``--hidden N --layers L`` make the MLP bigger (``L`` hidden layers of width ``N``), so the
  state is tens of MB (the defaults are the small model the scale-out tests use);
- ``--memory-report PATH``: rank 0 appends, for each snapshot it saw committed, the growth
  of its peak host RSS across that snapshot (peak reset just before the step boundary that
  captures it, read after ``run.flush()``) and the full state's size, one JSON line each.
  Large allocations are then made with mmap and returned on free, so the peak measures
  what a snapshot really holds, not what the allocator kept from earlier steps;
- ``--kill-rank R --kill-step S [--kill-point N]``: rank R arms ``burst.killpoints`` in
  step S's body (after its earlier snapshots are written), so the Nth kill point it
  reaches, in the snapshot taken at the next boundaries, SIGKILLs it;
  ``--killpoint-log PATH`` records the points' names in ``PATH.rank<R>`` (``--kill-point 0``:
  only record them).
"""

import argparse
import ctypes
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import burst
import burst.parallel
from burst import killpoints
from burst.snapshot.reader import list_steps

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1


class NoisyPairs(Dataset):
    """Inputs get fresh random noise on every read: per-sample randomness to replay."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 12, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(12), self.y[i], int(i)


def build(parallel: str, hidden: int = 32, layers: int = 1) -> torch.nn.Module:
    """An MLP of ``layers`` hidden layers of width ``hidden`` (the default is the small
    model the scale-out tests were written for: 12 -> 32 -> 3)."""
    torch.manual_seed(0)  # the same initial weights on every rank
    modules: list[torch.nn.Module] = [torch.nn.Linear(12, hidden), torch.nn.Tanh()]
    for _ in range(layers - 1):
        modules += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
    model = torch.nn.Sequential(*modules, torch.nn.Linear(hidden, 3))
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The full (global) size of the model and optimizer tensors, whatever the sharding:
    a DTensor's ``numel`` is its global one."""
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _proc_status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class MemoryReport:
    """Rank 0's peak host-RSS growth across each committed snapshot (JSON lines).

    :meth:`before` (just before a step boundary) drains earlier snapshots, notes the RSS
    and resets the peak (``clear_refs`` 5 sets VmHWM to the current RSS); :meth:`after`
    (after the boundary) waits for this one and reads the peak. A line is written only
    when a snapshot was committed in between (or always, for the final one)."""

    def __init__(self, path: str, run: burst.Run, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> None:
        self.path, self.run, self.model, self.optimizer = path, run, model, optimizer
        self.step: int | None = None
        self.base, self.before_steps, self.final = 0, set(), False
        libc = ctypes.CDLL("libc.so.6")  # large blocks mapped, and unmapped on free
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 10)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 10)

    def before(self, step: int, final: bool = False) -> None:
        self.run.flush()
        self.before_steps = set(list_steps(self.run.store, self.run.run_id))
        self.step, self.final = step, final
        self.base = _proc_status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")

    def after(self) -> None:
        if self.step is None:
            return
        self.run.flush()
        peak = _proc_status("VmHWM")
        steps = set(list_steps(self.run.store, self.run.run_id))
        if self.final or steps - self.before_steps:
            line = {"step": self.step, "final": self.final, "rss_before": self.base,
                    "peak": peak, "growth": peak - self.base,
                    "state_bytes": state_bytes(self.model, self.optimizer),
                    "world": self.run.world_size}
            with open(self.path, "a") as out:
                out.write(json.dumps(line) + "\n")
        self.step = None


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--records", required=True)
    p.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default="none")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--kill-at", default="", help="STEP:MICRO: rank 0 SIGKILLs itself there")
    p.add_argument("--hidden", type=int, default=32, help="width of the hidden layers")
    p.add_argument("--layers", type=int, default=1, help="number of hidden layers")
    p.add_argument("--persist-every", type=int, default=3)
    p.add_argument("--memory-report", default="", help="rank 0's RSS growth per snapshot")
    p.add_argument("--kill-rank", type=int, default=-1, help="the rank that arms kill points")
    p.add_argument("--kill-step", type=int, default=-1, help="armed in this step's body")
    p.add_argument("--kill-point", type=int, default=1, help="die at the Nth point (0: never)")
    p.add_argument("--killpoint-log", default="", help="point names to PATH.rank<R>")
    return p.parse_args()


def arm_kill(args: argparse.Namespace, run: burst.Run) -> None:
    """Rank ``--kill-rank``: kill (or just log) at the kill points its next snapshots
    reach; the snapshots already queued are written first, so they count none."""
    run.flush()
    log = f"{args.killpoint_log}.rank{run.rank}" if args.killpoint_log else None
    killpoints.arm(args.kill_point or None, log=log)


def main() -> None:
    args = parse()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    group = burst.parallel.init_from_env()
    if group.world_size > 1 and args.parallel == "none":
        raise SystemExit("several ranks need --parallel ddp or fsdp")

    data = burst.SeededDataset(NoisyPairs(args.samples), seed=7)
    model = build(args.parallel, args.hidden, args.layers)
    torch.manual_seed(1000 + group.rank)  # each rank its own stream (what the draws record)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    run = burst.Run(args.run_id, store=args.store, global_batch=args.global_batch,
                    micro_batch=args.micro_batch, shadow_every=1, persist_every=args.persist_every, keep=100)
    report = run.attach(model, optimizer, scheduler)
    if report:
        print(f"rank {run.rank}: {report}", flush=True)
    loader = DataLoader(data, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(data, seed=3))
    kill_step, kill_micro = map(int, args.kill_at.split(":")) if args.kill_at else (-1, -1)
    memory = (MemoryReport(args.memory_report, run, model, optimizer)
              if args.memory_report and run.rank == 0 else None)

    with open(f"{args.records}.rank{run.rank}", "a") as records:
        for epoch in run.epochs(args.epochs):
            for step in run.steps(loader):
                if memory is not None:
                    memory.after()  # the previous boundary's snapshot
                indices, total = [], 0.0
                for micro, (x, y, index) in enumerate(burst.parallel.accumulate(step, model)):
                    if (step.index, micro, run.rank) == (kill_step, kill_micro, 0):
                        run.flush()  # the snapshot being written must exist; then die hard
                        os.kill(os.getpid(), signal.SIGKILL)
                    loss = torch.nn.functional.cross_entropy(model(x), y) * step.weight(len(x))
                    loss.backward()
                    indices += index.tolist()
                    total += loss.item()
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                draw = torch.rand(1).item()  # this rank's generator moves every step
                records.write(json.dumps({"step": step.index, "epoch": epoch, "indices": indices,
                                          "samples": step.samples, "world": run.world_size,
                                          "loss": total.hex(), "draw": draw.hex()}) + "\n")
                records.flush()
                if (step.index, run.rank) == (args.kill_step, args.kill_rank):
                    arm_kill(args, run)
                if memory is not None:
                    memory.before(step.index)
    if memory is not None:
        memory.after()
        memory.before(run.step, final=True)
    run.close()  # returns on every rank once rank 0 has stored the final snapshot
    if memory is not None:
        memory.after()
    if dist.is_initialized():
        # torch 2.13's gloo process group can deadlock in its destructor at interpreter
        # teardown (it joins its worker thread while holding the GIL that thread needs
        # to free a finished collective's tensors); everything is stored and flushed.
        os._exit(0)


if __name__ == "__main__":
    main()

"""Benchmark: what a snapshot costs the training loop, and how fast a restore is.

For a state of about 1 GB (a model plus its Adam moments) this prints, side by side in
one process:

- blocked: how long ``run.snapshot()`` holds the training loop (the RAM-shadow copy);
- floor: a plain copy of the same tensors into preallocated host memory;
- torch.save: writing the same state with ``torch.save`` to the same disk, and with an
  ``fsync`` after it (burst's persist is durable, so that is the like-for-like write);
- restore: ``Run.attach`` (verify every hash, load) vs ``torch.load`` +
  ``load_state_dict``, and vs ``torch.load(mmap=True)`` + ``load_state_dict`` (the
  fastest way torch has: the parameters are copied straight from the file's pages, and
  the optimizer keeps its state tensors mapped, read only when first used). burst maps
  a local tier's blobs too, after hashing every byte, and gives host state the
  optimizer keeps one bulk copy of its own (cheaper than a page fault per 4 KiB at the
  first step). A second row for each adds that first use of the moments, as the first
  optimizer step would. The moments are random, as trained ones are: all-zero ones
  would be stored once and flatter every figure but the stall;
- restore, like for like: ``torch.load(mmap=True)`` after checking the file's SHA-256
  against the digest taken when it was saved, as ``sha256sum -c`` would (one thread).
  burst checks every blob's hash before it hands anything over (DESIGN.md: a reader
  checks every blob's hash), and ``torch.load`` does not: a byte flipped in a
  tensor's data loads without a word, with or without ``mmap``.

Measurements are interleaved (a round of each, ``--repeat`` rounds, the order rotating
by round) and medians reported:
a shared machine is noisy. Targets (issue 17): blocked <= 1.3x floor and < 0.3x
torch.save + fsync; restore <= torch.load(mmap=True). Figures are ratios measured in the
same run, never absolute timings checked in tests.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import burst
from burst.node.bootstrap import sha256_of  # what sha256sum prints, one thread


def build(gigabytes: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model with Adam state: parameters are a third of the bytes, moments two thirds."""
    params_total = int(gigabytes * (1 << 30) / 4 / 3)
    layers, width = 8, 4096
    per_layer = params_total // layers
    model = torch.nn.Sequential(*[torch.nn.Linear(width, per_layer // width, bias=True)
                                  for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()  # moments of their own: all-zero ones would be stored once (dedup)
    return model, optimizer


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0, help="state size in GiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    workdir = Path(tempfile.mkdtemp(prefix="burst-bench-", dir=args.dir))
    model, optimizer = build(args.gb)
    size = state_bytes(model, optimizer)
    print(f"state: {size / (1 << 30):.2f} GiB in {len(model.state_dict())} model tensors "
          f"+ Adam moments; writing to {workdir}")

    live = {**{f"m/{k}": v for k, v in model.state_dict().items()},
            **{f"o/{i}/{k}": v for i, s in optimizer.state.items() for k, v in s.items()}}
    buffers = {k: torch.empty_like(v) for k, v in live.items()}

    def floor() -> None:
        for k, v in live.items():
            buffers[k].copy_(v)

    run = burst.Run("bench", store=workdir / "store", global_batch=1, persist_seconds=None,
                    keep=1)
    run.attach(model, optimizer)
    run.snapshot(wait=True)  # first snapshot allocates the shadow buffers

    floor()  # touch the buffers once, as the run's first snapshot touched its shadow
    saved = workdir / "torch.pt"
    full_state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def save_fsync() -> None:
        with open(saved, "wb") as f:
            torch.save(full_state, f)
            f.flush()
            os.fsync(f.fileno())

    def touch_moments() -> None:
        """What the first optimizer step does to the restored Adam moments (torch's still
        mapped, so each page faults in now; burst's already its own memory)."""
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim():
                    value.mul_(1)

    def burst_restore(touch: bool = False) -> None:
        burst.Run("bench", store=workdir / "store", global_batch=1,
                  persist_seconds=None).attach(model, optimizer)
        if touch:
            touch_moments()

    def torch_restore(mmap: bool, touch: bool = False, digest: str | None = None) -> None:
        if digest is not None and sha256_of(str(saved)) != digest:
            raise SystemExit(f"{saved} changed under the benchmark")
        loaded = torch.load(saved, weights_only=True, mmap=mmap)
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
        if touch:
            touch_moments()

    def blocked() -> None:
        run.snapshot()  # returns once the RAM copy is done; the write goes on behind

    # two interleaved groups: the restores come after the last snapshot of ``run``
    writes = {"floor": floor, "blocked": blocked,
              "save": lambda: torch.save(full_state, saved), "save+fsync": save_fsync}
    reads = {"restore": burst_restore, "restore-touched": lambda: burst_restore(touch=True),
             "load": lambda: torch_restore(False),
             "load-mmap": lambda: torch_restore(True),
             "load-mmap-touched": lambda: torch_restore(True, touch=True),
             "checked-mmap": lambda: torch_restore(True, digest=digest),
             "checked-mmap-touched": lambda: torch_restore(True, touch=True, digest=digest)}
    times: dict[str, list[float]] = {name: [] for name in {**writes, **reads}}
    digest = ""
    for cases in (writes, reads):
        digest = sha256_of(str(saved)) if saved.exists() else digest  # the last save's, once
        for round_ in range(args.repeat):
            # the order rotates by round: a case that always ran right after another
            # paid for what that one left (its memory to free, the page cache it evicted)
            names = list(cases)[round_ % len(cases):] + list(cases)[:round_ % len(cases)]
            for name in names:
                times[name] += timed(cases[name], 1)
                if name == "blocked":
                    run.flush()  # let the background write finish before the next one
    floor_times, blocked_times = times["floor"], times["blocked"]
    save_times, sync_times = times["save"], times["save+fsync"]
    restore_times, load_times, mmap_times = times["restore"], times["load"], times["load-mmap"]
    touched_times, restore_touched = times["load-mmap-touched"], times["restore-touched"]
    checked_times, checked_touched = times["checked-mmap"], times["checked-mmap-touched"]

    med = statistics.median
    rows = [
        ("loop blocked per snapshot (burst)", med(blocked_times)),
        ("plain copy of the same bytes (floor)", med(floor_times)),
        ("torch.save to the same disk", med(save_times)),
        ("torch.save + fsync", med(sync_times)),
        ("restore: burst (verify + load)", med(restore_times)),
        ("  the same, Adam moments then touched", med(restore_touched)),
        ("restore: torch.load + load_state_dict", med(load_times)),
        ("restore: torch.load(mmap=True) + load", med(mmap_times)),
        ("  the same, Adam moments then touched", med(touched_times)),
        ("restore: sha256 check + torch.load(mmap)", med(checked_times)),
        ("  the same, Adam moments then touched", med(checked_touched)),
    ]
    print(f"median of {args.repeat} interleaved rounds (load average {os.getloadavg()[0]:.1f}):")
    for label, seconds in rows:
        print(f"{label:<40} {seconds * 1000:9.1f} ms  {size / seconds / (1 << 30):6.2f} GiB/s")
    print(f"blocked / floor              = {med(blocked_times) / med(floor_times):.2f}x  "
          "(target <= 1.3)")
    print(f"blocked / torch.save + fsync = {med(blocked_times) / med(sync_times):.2f}x  "
          "(target < 0.3)")
    print(f"restore / torch.load         = {med(restore_times) / med(load_times):.2f}x")
    print(f"restore / torch.load(mmap)   = {med(restore_times) / med(mmap_times):.2f}x  "
          "(target <= 1; torch leaves the Adam moments mapped and unread, burst verifies "
          "and copies them)")
    print(f"the same, moments then touched = {med(restore_touched) / med(touched_times):.2f}x"
          "  (the first optimizer step: torch's moments then fault in page by page)")
    print(f"restore / checked mmap load  = {med(restore_times) / med(checked_times):.2f}x  "
          "(like for like: both check every byte before use)")
    print(f"the same, moments then touched = {med(restore_touched) / med(checked_touched):.2f}x")


if __name__ == "__main__":
    main()

"""Benchmark: what burst's adaptive snapshot intervals cost over a long CPU run.

Issue 17's target: with the defaults (``persist_seconds="auto"``, a 1% overhead budget)
burst costs at most 1% of training time over a 10-minute run, and the first persisted
snapshot lands within 60 s.

One process trains ``bench_loop``'s small Transformer (two DataLoader workers,
``SeededDataset``) three ways, back to back, with the same model, data and layout:

1. the plain loop (no burst) for ``--plain-minutes``;
2. the README loop with burst's defaults for ``--minutes``, on a local store;
3. the plain loop again for ``--plain-minutes``,

so that a drift of the machine over the run hits both sides. It prints:

- time per optimizer step: the plain windows' mean (each after its first epoch) and the
  burst run's, and their ratio (the overhead, side by side);
- the overhead burst expects from its own measured costs (shadow copy cost over the
  shadow interval, persist cost over the persist interval), and the intervals it chose;
- when the first snapshot was persisted, counted from ``Run`` creation, and how many were.

The machine's noise is what it is: on a shared 2-core box the side-by-side ratio moves by
a few percent between runs, so read it with the expected overhead beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import burst
from burst import events
from burst.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop import Workload, fresh, plain_loop, workloads  # a sibling script


def transformer() -> Workload:
    return next(w for w in workloads() if w.name == "transformer")


def plain_window(workload: Workload, seconds: float) -> list[float]:
    """Step times of the plain loop over ``seconds`` of training, the first epoch left out."""
    marks = plain_loop(workload, Path(), seconds=seconds)
    return [b - a for a, b in itertools.pairwise(marks)][workload.steps_per_epoch:]


def burst_window(workload: Workload, seconds: float, root: Path) -> dict:
    """The README loop with burst's defaults for ``seconds``; its step times and what it did."""
    model, optimizer = fresh(workload)
    data = burst.SeededDataset(workload.data, seed=0)
    created = time.time()
    run = burst.Run("adaptive", store=str(root / "store"),
                    global_batch=workload.micro * workload.accumulation,
                    micro_batch=workload.micro)
    run.attach(model, optimizer)
    loader = DataLoader(data, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(data, seed=0),
                        num_workers=workload.workers, persistent_workers=workload.workers > 0)
    times, start = [], time.perf_counter()
    for _epoch in run.epochs(1 << 30):
        for step in run.steps(loader):
            began = time.perf_counter()
            for x, y in step:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (loss * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(began)  # the step's end is the next step's start (boundary work in)
        if time.perf_counter() - start >= seconds:
            break
    intervals = run.intervals()
    run.close()
    snapshots = [e for e in events.read(open_store(str(root / "store")), "adaptive")
                 if e.get("event") == "snapshot"]
    first = datetime.fromisoformat(snapshots[0]["time"]).timestamp() if snapshots else None
    steps = [b - a for a, b in itertools.pairwise(times)]
    return {"steps": steps[workload.steps_per_epoch:], "intervals": intervals.as_dict(),
            "snapshots": len(snapshots),
            "first_snapshot_s": None if first is None else round(first - created, 1)}


def expected_overhead(intervals: dict) -> float | None:
    """The fraction of training time burst's own measured costs say it spends."""
    step, shadow = intervals.get("step_seconds"), intervals.get("shadow_cost")
    persist, every = intervals.get("persist_cost"), intervals.get("persist_seconds")
    if not step or shadow is None:
        return None
    share = shadow / (intervals["shadow_every"] * step)
    if persist is not None and every:
        share += persist / every
    return share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--plain-minutes", type=float, default=1.5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("BURST_WHEELS", "none")
    torch.set_num_threads(1)
    workload = transformer()
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
        before = plain_window(workload, args.plain_minutes * 60)
        run = burst_window(workload, args.minutes * 60, Path(tmp))
        after = plain_window(workload, args.plain_minutes * 60)
    plain = statistics.fmean(before + after)
    with_burst = statistics.fmean(run["steps"])
    result = {"minutes": args.minutes, "plain_ms_per_step": round(1000 * plain, 3),
              "plain_before_ms": round(1000 * statistics.fmean(before), 3),
              "plain_after_ms": round(1000 * statistics.fmean(after), 3),
              "burst_ms_per_step": round(1000 * with_burst, 3),
              "ratio": round(with_burst / plain, 4),
              "expected_overhead": expected_overhead(run["intervals"]),
              "first_snapshot_s": run["first_snapshot_s"], "snapshots": run["snapshots"],
              "intervals": run["intervals"]}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"plain loop   {result['plain_ms_per_step']} ms/step (before "
          f"{result['plain_before_ms']}, after {result['plain_after_ms']})")
    print(f"burst        {result['burst_ms_per_step']} ms/step over {args.minutes:g} min: "
          f"{result['ratio']}x the plain loop")
    expected = result["expected_overhead"]
    print(f"expected     {'?' if expected is None else f'{100 * expected:.2f}%'} of training "
          f"time from burst's measured costs; intervals {run['intervals']}")
    print(f"snapshots    {run['snapshots']} persisted, the first {run['first_snapshot_s']} s "
          "after Run()")


if __name__ == "__main__":
    main()

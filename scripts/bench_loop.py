"""Benchmark: what the README's training loop costs over the same loop without burst.

Each workload is trained the plain way (a DataLoader over a seeded ``RandomSampler``,
gradient accumulation by hand) and the README's way (``burst.Run`` + ``ResumableSampler``
+ ``run.steps``), with the same model, data, micro-batch, accumulation and workers, in
the same process. Figures (ratios against the plain loop, per round, then the median):

- steady: mean time per optimizer step after the first epoch, with burst's default
  intervals (periodic costs such as the RAM shadow copy are included, not hidden by a
  median). The two loops run in *lockstep*: one optimizer step of each in turn, so a
  noisy neighbour or a slower moment of the machine lands on both alike, step by step.
  Whole runs taken one after the other differ by 10-30% on this machine from one second
  to the next, far more than a 2% target on a millisecond step can be read through;
- whole: wall time of the whole run, from building the loader to ``run.close()``;
- every-step: steady state with a snapshot persisted at every optimizer step;
- every-step-bound: the same loop in lockstep with the plain one, each step waiting
  until its snapshot is written (``run.flush()``) before the next loop's turn: the
  whole write is charged to the step that asked for it and overlaps nothing, so this
  is an upper bound on what persisting every step costs, read without the noise of
  runs taken one after the other.

``whole`` and ``every-step`` come from whole runs one after the other, the order
rotating by round: a loop that persists every step keeps a background writer busy that
in lockstep would land on the baseline's steps too (``every-step-bound`` waits it out).
The README loop runs with burst's defaults, so its intervals are the ones burst chose
from measured costs (printed too). The machine's noise shows in the min-max spread of
the per-round ratios: compare medians over several ``--rounds``.

- first-60: wall time from the start of a whole run (building the model, ``burst.Run``,
  ``attach``, the loader) to the end of its 60th optimizer step: burst's first seconds
  (the freeze thread, the code archive, the inputs recorder, the first copies) land
  there, where a short run or a first impression sees them.

Workloads: a 16->32->2 MLP (about a millisecond per step: burst's fixed per-step cost
shows), a small Transformer encoder fed by two DataLoader workers through
``SeededDataset`` (random token masking in ``__getitem__``), and ``lm60``: a loop
nobody here tuned, as issue 32 found it: a small Transformer LM with dropout, a
DataLoader without workers, a step of about 50 ms, two epochs of 60 steps. Issue 17's
targets: steady <= 1.05x (MLP) and <= 1.02x (Transformer); whole <= 1.03x; every-step
<= 1.25x (Transformer; met for certain if the bound meets it). Issue 32's: steady <=
1.02x and first-60 <= 1.05x on the Transformers. Figures are ratios measured side by side, never timed assertions in tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset

import burst


@dataclass(frozen=True)
class Workload:
    """What is trained: the model's factory, the data, and the batch layout."""

    name: str
    model: Callable[[], torch.nn.Module]
    data: Dataset
    micro: int
    accumulation: int
    workers: int
    epochs: int
    seeded: bool  # burst's loop wraps the data in SeededDataset (per-sample randomness)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.data) // (self.micro * self.accumulation)  # type: ignore[arg-type]


class MaskedTokens(Dataset):
    """Token sequences with random masking drawn from torch's generator per sample."""

    def __init__(self, samples: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(1, vocab, (samples, length), generator=g)
        self.labels = torch.randint(0, 2, (samples,), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokens[int(index)].clone()
        tokens[torch.rand(tokens.shape) < 0.15] = 0  # the augmentation burst must replay
        return tokens, self.labels[int(index)]


class Encoder(torch.nn.Module):
    """A small Transformer classifier (about 0.2 M parameters)."""

    def __init__(self, vocab: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=128,
                                                 batch_first=True, dropout=0.1)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2,
                                                   enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class TinyLM(torch.nn.Module):
    """A small causal Transformer LM with dropout (about 0.9 M parameters), predicting
    each sequence's last token (so the plain loop's cross-entropy fits it as is)."""

    def __init__(self, vocab: int = 2000, width: int = 128, context: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width,
                                                 batch_first=True, dropout=0.1)
        self.blocks = torch.nn.TransformerEncoder(layer, num_layers=2,
                                                  enable_nested_tensor=False)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(tokens) + self.position[:tokens.shape[1]])
        return self.head(self.blocks(x, is_causal=False)[:, -1])


def workloads() -> list[Workload]:
    g = torch.Generator().manual_seed(0)
    points = TensorDataset(torch.randn(2048, 16, generator=g), torch.randint(0, 2, (2048,),
                                                                             generator=g))

    def mlp() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 2))

    return [Workload("mlp", mlp, points, micro=8, accumulation=4, workers=0, epochs=4,
                     seeded=False),
            Workload("transformer", Encoder, MaskedTokens(1024, 32, 1000), micro=8,
                     accumulation=4, workers=2, epochs=3, seeded=True),
            Workload("lm60", TinyLM, _next_tokens(12 * 60, 32, 2000), micro=12,
                     accumulation=1, workers=0, epochs=2, seeded=False)]


def _next_tokens(samples: int, length: int, vocab: int) -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, vocab, (samples, length + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, -1])


def fresh(workload: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = workload.model()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def plain_steps(workload: Workload, seconds: float | None = None) -> Iterator[None]:
    """The loop without burst, pausing after each optimizer step. With ``seconds``, whole
    epochs until that much time has passed (``bench_adaptive``)."""
    model, optimizer = fresh(workload)
    sampler = RandomSampler(workload.data, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(workload.data, batch_size=workload.micro, sampler=sampler,
                        num_workers=workload.workers, drop_last=True,
                        persistent_workers=workload.workers > 0)
    start = time.perf_counter()
    epochs = range(workload.epochs) if seconds is None else itertools.count()
    for _epoch in epochs:
        if seconds is not None and time.perf_counter() - start >= seconds:
            break
        batches = iter(loader)
        for _step in range(workload.steps_per_epoch):
            for _ in range(workload.accumulation):
                x, y = next(batches)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (loss / workload.accumulation).backward()
            optimizer.step()
            optimizer.zero_grad()
            yield


CHOSEN: dict[str, dict[str, Any]] = {}  # the intervals the default run chose, by workload


def burst_steps(workload: Workload, workdir: Path, settle: bool = False,
                **run_options: Any) -> Iterator[None]:
    """The README's loop, pausing after each optimizer step; ``run.close()`` runs after
    the last pause. ``settle``: wait for the step's snapshot to be written before the
    pause, so its whole cost lands on its own step (nothing overlaps the next one)."""
    model, optimizer = fresh(workload)
    data = burst.SeededDataset(workload.data, seed=0) if workload.seeded else workload.data
    run = burst.Run(workdir.name, store=str(workdir / "store"),
                    global_batch=workload.micro * workload.accumulation,
                    micro_batch=workload.micro, **run_options)
    run.attach(model, optimizer)
    sampler = burst.ResumableSampler(data, seed=0)
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=sampler,
                        num_workers=workload.workers, persistent_workers=workload.workers > 0)
    for _epoch in run.epochs(workload.epochs):
        for step in run.steps(loader):
            for x, y in step:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (loss * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
            if settle:
                run.flush()
            yield
    if not run_options:
        CHOSEN[workload.name] = run.intervals().as_dict()
    run.close()


def marks_of(steps: Iterator[None]) -> list[float]:
    """Run a loop to its end: the time at its start and at each optimizer step's end,
    then at its very end (``run.close()`` included)."""
    marks = [time.perf_counter()]
    for _ in steps:
        marks.append(time.perf_counter())
    marks.append(time.perf_counter())
    return marks


def plain_loop(workload: Workload, _workdir: Path, seconds: float | None = None) -> list[float]:
    return marks_of(plain_steps(workload, seconds))


VARIANTS: dict[str, Callable[[Workload, Path], Iterator[None]]] = {
    "plain": lambda w, _d: plain_steps(w),
    "burst": burst_steps,
    "every-step": lambda w, d: burst_steps(w, d, shadow_every=1, persist_every=1,
                                           persist_seconds=None),
    "every-step-settled": lambda w, d: burst_steps(w, d, settle=True, shadow_every=1,
                                                   persist_every=1, persist_seconds=None),
}


def lockstep(workload: Workload, names: list[str], root: Path) -> dict[str, list[float]]:
    """Run the loops ``names`` side by side, one optimizer step of each in turn (the order
    rotating every step): the time each of their steps took. A noisy neighbour or a
    slower moment of the machine then lands on every loop alike, step by step, which
    whole runs taken one after the other cannot promise for a step of a millisecond."""
    loops = {name: VARIANTS[name](workload, _fresh_dir(root, workload, name)) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in itertools.count():
        order = names[turn % len(names):] + names[:turn % len(names)]
        for name in order:
            began = time.perf_counter()
            if next(loops[name], StopIteration) is StopIteration:
                return times
            times[name].append(time.perf_counter() - began)
    return times


def _fresh_dir(root: Path, workload: Workload, name: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"{workload.name}-{name}-", dir=root))
    return path


def steady(step_times: list[float], workload: Workload) -> float:
    """Mean time per step after the first epoch (periodic costs such as the RAM shadow
    copy are included, not hidden by a median)."""
    return statistics.fmean(step_times[workload.steps_per_epoch:])


FIRST = 60  # the steps a first impression (and issue 32's reference loop) covers


def first_steps(marks: list[float]) -> float:
    """Seconds from a whole run's start to the end of its ``FIRST``-th step (or its last)."""
    return marks[min(FIRST, len(marks) - 2)] - marks[0]


def measure(workload: Workload, count: int, root: Path) -> dict[str, Any]:
    """Per round: ``steady`` from the plain and README loops in lockstep; ``whole`` and
    ``every-step`` from whole runs one after the other (the order rotating by round). A
    loop that persists every step keeps a background writer busy, which in lockstep would
    land on the baseline's steps too: it runs alone, charged with all of its own work."""
    ratios: dict[str, list[float]] = {"steady": [], "whole": [], "first-60": [],
                                      "every-step": [], "every-step-bound": []}
    plain_steps_seconds = []
    names = ["plain", "burst", "every-step"]
    for index in range(count):
        pair = lockstep(workload, ["plain", "burst"], root)
        base = steady(pair["plain"], workload)
        plain_steps_seconds.append(base)
        ratios["steady"].append(steady(pair["burst"], workload) / base)
        # a pair of its own: with three loops rotating, one follows the writing loop more
        # often than the other, and the writes' aftermath would land on it unevenly
        pair = lockstep(workload, ["plain", "every-step-settled"], root)
        ratios["every-step-bound"].append(steady(pair["every-step-settled"], workload)
                                          / steady(pair["plain"], workload))
        marks = {}
        for name in names[index % len(names):] + names[:index % len(names)]:
            marks[name] = marks_of(VARIANTS[name](workload, _fresh_dir(root, workload, name)))
        steps = {name: [b - a for a, b in itertools.pairwise(m[:-1])] for name, m in marks.items()}
        ratios["whole"].append((marks["burst"][-1] - marks["burst"][0])
                               / (marks["plain"][-1] - marks["plain"][0]))
        ratios["first-60"].append(first_steps(marks["burst"]) / first_steps(marks["plain"]))
        ratios["every-step"].append(steady(steps["every-step"], workload)
                                    / steady(steps["plain"], workload))
    return {"workload": workload.name, "rounds": count,
            "plain_ms_per_step": round(1000 * statistics.median(plain_steps_seconds), 3),
            **{name: round(statistics.median(values), 3) for name, values in ratios.items()},
            "spread": {name: [round(min(values), 3), round(max(values), 3)]
                       for name, values in ratios.items()},
            "per_round": {name: [round(v, 3) for v in values]
                          for name, values in ratios.items()},
            "chosen_intervals": CHOSEN.get(workload.name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=[w.name for w in workloads()], default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    os.environ.setdefault("BURST_WHEELS", "none")  # a local store builds no wheelhouse anyway
    torch.set_num_threads(args.threads)  # both loops alike; fewer threads, less noise
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        for workload in workloads():
            if args.only in (None, workload.name):
                results.append(measure(workload, args.rounds, Path(tmp)))
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    print(f"{'workload':<12} {'plain ms/step':>13} {'steady':>8} {'whole':>8} {'first-60':>8}"
          f" {'every-step':>10} {'bound':>6}   (medians; [min-max] over rounds)")
    for r in results:
        print(f"{r['workload']:<12} {r['plain_ms_per_step']:>13} {r['steady']:>7}x "
              f"{r['whole']:>7}x {r['first-60']:>7}x {r['every-step']:>9}x "
              f"{r['every-step-bound']:>5}x   "
              + " ".join(f"{k} [{lo}-{hi}]" for k, (lo, hi) in r["spread"].items()))
        chosen = r["chosen_intervals"] or {}
        print(f"{'':<12} default run chose: shadow every {chosen.get('shadow_every')} steps, "
              f"persist every {chosen.get('persist_seconds')} s")


if __name__ == "__main__":
    main()

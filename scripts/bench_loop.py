"""Benchmark: what the README's training loop costs over the same loop without burst.

Each workload is trained the plain way (a DataLoader over a seeded ``RandomSampler``,
gradient accumulation by hand) and the README's way (``burst.Run`` + ``ResumableSampler``
+ ``run.steps``), with the same model, data, micro-batch, accumulation and workers, in
the same process, interleaved round by round so that a noisy neighbour hits both alike.
Figures (ratios against the plain loop, per round, then the median):

- steady: mean time per optimizer step after the first epoch (periodic costs such as the
  RAM shadow copy and the background persist are included, not hidden by a median);
- whole: wall time of the whole run, from building the loader to ``run.close()``;
- every-step: steady state with a snapshot persisted at every optimizer step.

The README loop runs with burst's defaults, so its intervals are the ones burst chose
from measured costs (printed too). The machine's noise shows in the min-max spread of
the per-round ratios: compare medians over several ``--rounds``.

Workloads: a 16->32->2 MLP (about a millisecond per step: burst's fixed per-step cost
shows) and a small Transformer encoder fed by two DataLoader workers through
``SeededDataset`` (random token masking in ``__getitem__``). Issue 17's targets: steady
<= 1.05x (MLP) and <= 1.02x (Transformer); whole <= 1.03x; every-step <= 1.25x
(Transformer). Figures are ratios measured side by side, never timed assertions in tests.
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
                     accumulation=4, workers=2, epochs=3, seeded=True)]


def fresh(workload: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = workload.model()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def plain_loop(workload: Workload, _workdir: Path, seconds: float | None = None) -> list[float]:
    """The loop without burst; returns the time at each optimizer step's end. With
    ``seconds``, whole epochs until that much time has passed (``bench_adaptive``)."""
    model, optimizer = fresh(workload)
    sampler = RandomSampler(workload.data, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(workload.data, batch_size=workload.micro, sampler=sampler,
                        num_workers=workload.workers, drop_last=True,
                        persistent_workers=workload.workers > 0)
    marks = [time.perf_counter()]
    epochs = range(workload.epochs) if seconds is None else itertools.count()
    for _epoch in epochs:
        if seconds is not None and marks[-1] - marks[0] >= seconds:
            break
        batches = iter(loader)
        for _step in range(workload.steps_per_epoch):
            for _ in range(workload.accumulation):
                x, y = next(batches)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (loss / workload.accumulation).backward()
            optimizer.step()
            optimizer.zero_grad()
            marks.append(time.perf_counter())
    return marks


CHOSEN: dict[str, dict[str, Any]] = {}  # the intervals the default run chose, by workload


def burst_loop(workload: Workload, workdir: Path, **run_options: Any) -> list[float]:
    """The README's loop; returns the time at each optimizer step's end (close included)."""
    model, optimizer = fresh(workload)
    data = burst.SeededDataset(workload.data, seed=0) if workload.seeded else workload.data
    marks = [time.perf_counter()]
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
            marks.append(time.perf_counter())
    if not run_options:
        CHOSEN[workload.name] = run.intervals().as_dict()
    run.close()
    marks.append(time.perf_counter())
    return marks


def steady(marks: list[float], workload: Workload) -> float:
    """Mean time per step after the first epoch (close excluded)."""
    steps = [b - a for a, b in itertools.pairwise(marks)][:workload.steps_per_epoch
                                                          * workload.epochs]
    return statistics.fmean(steps[workload.steps_per_epoch:])


VARIANTS: dict[str, Callable[[Workload, Path], list[float]]] = {
    "plain": plain_loop,
    "burst": burst_loop,
    "every-step": lambda w, d: burst_loop(w, d, shadow_every=1, persist_every=1,
                                          persist_seconds=None),
}


def rounds(workload: Workload, count: int, root: Path) -> Iterator[dict[str, list[float]]]:
    """Each round runs every variant once, in an order that rotates between rounds."""
    names = list(VARIANTS)
    for index in range(count):
        order = names[index % len(names):] + names[:index % len(names)]
        marks = {}
        for name in order:
            workdir = root / f"{workload.name}-{name}-{index}"
            workdir.mkdir()
            marks[name] = VARIANTS[name](workload, workdir)
        yield marks


def measure(workload: Workload, count: int, root: Path) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {"steady": [], "whole": [], "every-step": []}
    plain_steps = []
    for marks in rounds(workload, count, root):
        base = steady(marks["plain"], workload)
        plain_steps.append(base)
        ratios["steady"].append(steady(marks["burst"], workload) / base)
        ratios["whole"].append((marks["burst"][-1] - marks["burst"][0])
                               / (marks["plain"][-1] - marks["plain"][0]))
        ratios["every-step"].append(steady(marks["every-step"], workload) / base)
    return {"workload": workload.name, "rounds": count,
            "plain_ms_per_step": round(1000 * statistics.median(plain_steps), 3),
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
    print(f"{'workload':<12} {'plain ms/step':>13} {'steady':>8} {'whole':>8} {'every-step':>10}"
          "   (medians; [min-max] over rounds)")
    for r in results:
        print(f"{r['workload']:<12} {r['plain_ms_per_step']:>13} {r['steady']:>7}x "
              f"{r['whole']:>7}x {r['every-step']:>9}x   "
              + " ".join(f"{k} [{lo}-{hi}]" for k, (lo, hi) in r["spread"].items()))
        chosen = r["chosen_intervals"] or {}
        print(f"{'':<12} default run chose: shadow every {chosen.get('shadow_every')} steps, "
              f"persist every {chosen.get('persist_seconds')} s")


if __name__ == "__main__":
    main()

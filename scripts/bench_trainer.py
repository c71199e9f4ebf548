"""Benchmark: what burst costs a Hugging Face Trainer, per optimizer step, against the same
Trainer without it (scripts/bench_loop.py does the same for a plain loop).

Both trainers fine-tune the same tiny GPT-2 (built from a config) on the same token
data, with the same arguments (micro-batch, accumulation, logging every 10 steps, no
Trainer checkpoints); one is ``transformers.Trainer`` with its own ``RandomSampler``, the
other ``BurstTrainer`` with burst's default intervals (RAM shadows and persists chosen
from measured costs: their periodic costs are included, not hidden by a median). They
run in *lockstep*, in one process: a callback hands the turn from one trainer to the
other at each step's start, so one optimizer step of each runs in turn and a noisy
neighbour on this shared machine lands on both alike. A step's time is from taking the
turn to handing it on: the step's forward and backward passes, the optimizer, logging,
burst's end-of-step work, and fetching the next step's batches.

Figures: the steady-state ratio (mean step time after the warm-up, burst / plain) per
round and their median; issue 31's target is within 2% (<= 1.02x) on the tiny GPT-2.
The burst trainer runs in the main thread (burst installs signal handlers there).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("BURST_FREEZE", "0")  # the environment freeze: not a per-step cost

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import burst
from burst.integrations.transformers import BurstTrainer

HERE = Path(__file__).resolve().parent
WARMUP = 20  # steps left out: first iterations, the allocator, the first intervals


def _example():
    spec = importlib.util.spec_from_file_location("example_transformers",
                                                  HERE / "example_transformers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Baton:
    """Whose turn it is: one trainer steps while the other waits."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.turn = names[0]
        self.done: set[str] = set()
        self.cond = threading.Condition()

    def hand_on(self, name: str) -> None:
        with self.cond:
            others = [n for n in self.names if n != name and n not in self.done]
            if others:
                self.turn = others[0]
            self.cond.notify_all()

    def wait(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == name or
                               all(n in self.done or n == name for n in self.names))

    def finish(self, name: str) -> None:
        with self.cond:
            self.done.add(name)
            self.hand_on(name)


class Lockstep(TrainerCallback):
    """Take turns at each step's start; record the time of each turn."""

    def __init__(self, name: str, baton: Baton) -> None:
        self.name, self.baton = name, baton
        self.started: float | None = None
        self.steps: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.started is not None:
            self.steps.append(now - self.started)
            self.baton.hand_on(self.name)
        self.baton.wait(self.name)
        self.started = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.started is not None:
            self.steps.append(time.perf_counter() - self.started)
        self.baton.finish(self.name)


def one_round(example, steps: int, width: int, workdir: Path, index: int) -> dict:
    samples = steps * 16
    data = example.Tokens(samples)
    common = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                  num_train_epochs=1, learning_rate=1e-3, logging_steps=10,
                  save_strategy="no", report_to=[], remove_unused_columns=False,
                  use_cpu=True, disable_tqdm=True, seed=7)
    baton = Baton(["burst", "plain"] if index % 2 == 0 else ["plain", "burst"])
    timers = {name: Lockstep(name, baton) for name in ("burst", "plain")}

    class Plain(example.Recording, Trainer):
        pass

    class WithBurst(example.Recording, BurstTrainer):
        pass

    torch.manual_seed(0)
    plain = Plain(model=example.tiny_gpt2(width), train_dataset=data,
                  args=TrainingArguments(output_dir=str(workdir / "plain"), **common),
                  callbacks=[timers["plain"]])
    run = burst.Run(f"bench-{index}", store=str(workdir / "store"), global_batch=16,
                    micro_batch=8)
    with_burst = WithBurst(run=run, model=example.tiny_gpt2(width), train_dataset=data,
                           args=TrainingArguments(output_dir=str(workdir / "burst"), **common),
                           callbacks=[timers["burst"]])
    thread = threading.Thread(target=plain.train)
    thread.start()
    with_burst.train()
    thread.join()
    means = {name: statistics.fmean(t.steps[WARMUP:]) for name, t in timers.items()}
    return {"plain_ms": means["plain"] * 1e3, "burst_ms": means["burst"] * 1e3,
            "ratio": means["burst"] / means["plain"],
            "intervals": run.intervals().as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per round")
    parser.add_argument("--width", type=int, default=64, help="GPT-2's n_embd")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    example = _example()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            rounds.append(one_round(example, args.steps, args.width, Path(tmp) / str(index),
                                    index))
    median = statistics.median(r["ratio"] for r in rounds)
    if args.json:
        print(json.dumps({"rounds": rounds, "median_ratio": median}))
        return
    for index, r in enumerate(rounds):
        print(f"round {index}: plain {r['plain_ms']:.2f} ms/step, burst {r['burst_ms']:.2f} "
              f"ms/step, ratio {r['ratio']:.3f}")
    print(f"steady-state ratio (median of {len(rounds)}): {median:.3f}x "
          f"(target <= 1.02x); intervals chosen: {rounds[-1]['intervals']}")


if __name__ == "__main__":
    main()

"""Benchmark: the training time a checkpoint really costs, burst against its peers.

A checkpoint's stall in the call is not what a user pays: an asynchronous save keeps
hashing and writing beside the steps that follow it, and on a host whose cores the step
uses it slows them. The figure that counts is **training time lost per checkpoint**: the
steps of a checkpointing phase (each checkpoint's step and the steps after it, up to the
next, and as many again after the last) minus as many plain steps.

One model (a Transformer LM with AdamW; about 46 M parameters, ~0.5 GiB of state; a
smaller one with ``--small``), one checkpoint every 4 steps, each method in a process of
its own, rounds interleaved (the order rotating by round). A process warms up (two steps
and one checkpoint, made durable: a first call's set-up is not the steady cost), then
trains a plain phase, a checkpointing phase, waits until the last checkpoint is durable,
and trains a second plain phase; the plain step time is the mean of both plain phases.

Methods: burst (``Run(persist_every=4, shadow_every=4)``, its persister at idle
priority as shipped), burst with the persister left at normal priority (what it cost
before), ``dcp.async_save`` (a one-process gloo group), accelerate's ``save_state`` (with
an fsync of what it wrote: durable, like the others) and ``torch.save`` + fsync.

Columns: lost per checkpoint; the stall in the call; the time from the call until the
checkpoint is durable (burst: its manifest is committed); and the ``dd conv=fsync`` floor
of writing the state's size to the same disk. Issue 32's target: lost <= 0.5x
``dcp.async_save``'s, durable within 3x the floor. A benchmark, not a test: ratios read
side by side on a shared machine (the load average is printed with the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

EVERY = 4  # steps between checkpoints
METHODS = ("burst", "burst-normal-priority", "dcp.async_save", "accelerate", "torch.save")


class LM(torch.nn.Module):
    """A decoder-style Transformer LM (pre-norm, causal, dropout 0.1)."""

    def __init__(self, vocab: int, width: int, layers: int, context: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        layer = torch.nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width,
                                                 batch_first=True, norm_first=True, dropout=0.1)
        self.blocks = torch.nn.TransformerEncoder(layer, num_layers=layers,
                                                  enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(
            context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


def shape(small: bool) -> dict[str, int]:
    if small:
        return {"vocab": 4096, "width": 256, "layers": 4, "context": 64, "batch": 4}
    return {"vocab": 16384, "width": 512, "layers": 9, "context": 64, "batch": 4}


class Trainer:
    """The model, its optimizer and a seeded stream of token batches."""

    def __init__(self, small: bool) -> None:
        torch.manual_seed(0)
        s = shape(small)
        self.vocab, self.batch, self.context = s["vocab"], s["batch"], s["context"]
        self.model = LM(s["vocab"], s["width"], s["layers"], s["context"])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.generator = torch.Generator().manual_seed(1)

    def step(self) -> None:
        tokens = torch.randint(0, self.vocab, (self.batch, self.context + 1),
                               generator=self.generator)
        logits = self.model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_bytes(self) -> int:
        tensors = [*self.model.state_dict().values()]
        for per_param in self.optimizer.state_dict()["state"].values():
            tensors += [t for t in per_param.values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


class Method:
    """One way to checkpoint: ``save`` is the call; ``durable`` blocks until the newest
    checkpoint is durable and returns when that happened (monotonic seconds)."""

    def __init__(self, trainer: Trainer, workdir: Path) -> None:
        self.trainer, self.workdir = trainer, workdir
        self.saves = 0

    def step(self) -> None:
        self.trainer.step()

    def save(self) -> None:
        raise NotImplementedError

    def durable(self) -> float:
        return time.monotonic()

    def close(self) -> None:
        """Nothing left running."""


class TorchSave(Method):
    def save(self) -> None:
        path = self.workdir / f"ckpt-{self.saves}.pt"
        self.saves += 1
        torch.save({"model": self.trainer.model.state_dict(),
                    "optim": self.trainer.optimizer.state_dict()}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())


class Accelerate(Method):
    def __init__(self, trainer: Trainer, workdir: Path) -> None:
        super().__init__(trainer, workdir)
        from accelerate import Accelerator
        self.accelerator = Accelerator(cpu=True)
        trainer.model, trainer.optimizer = self.accelerator.prepare(trainer.model,
                                                                    trainer.optimizer)

    def save(self) -> None:
        out = self.workdir / f"ckpt-{self.saves}"
        self.saves += 1
        self.accelerator.save_state(str(out))
        fsync_tree(out)


class DcpAsync(Method):
    def __init__(self, trainer: Trainer, workdir: Path) -> None:
        super().__init__(trainer, workdir)
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{workdir}/pg", rank=0,
                                world_size=1)
        self.future: object = None
        self.done_at = 0.0

    def save(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        if self.future is not None:  # DCP's own rule: one save in flight
            self.future.result()  # type: ignore[attr-defined]
        model, optim = get_state_dict(self.trainer.model, self.trainer.optimizer)
        out = self.workdir / f"ckpt-{self.saves}"
        self.saves += 1
        self.future = dcp.async_save({"model": model, "optim": optim}, checkpoint_id=str(out))
        self.future.add_done_callback(self._done)  # type: ignore[attr-defined]

    def _done(self, _future: object) -> None:
        self.done_at = time.monotonic()

    def durable(self) -> float:
        if self.future is not None:
            self.future.result()  # type: ignore[attr-defined]
        return self.done_at

    def close(self) -> None:
        import torch.distributed as dist
        self.durable()
        dist.destroy_process_group()


class Burst(Method):
    """burst's loop (``begin_step`` / ``end_step``) with ``run.snapshot()`` as the call:
    a shadow copy on the loop, then the persister in the background."""

    def __init__(self, trainer: Trainer, workdir: Path, idle: bool = True) -> None:
        super().__init__(trainer, workdir)
        import burst
        from burst.snapshot import priority
        if not idle:  # the persister as it was before issue 32
            os.environ[priority.ENV_PRIORITY] = priority.NORMAL
        self.store = workdir / "store"
        # no periodic work of its own: every copy and persist is a checkpoint asked for
        self.run = burst.Run("felt", store=str(self.store), global_batch=trainer.batch,
                             persist_every=None, shadow_every=1_000_000, persist_seconds=None)
        self.run.attach(trainer.model, trainer.optimizer)
        self.watch = Watch(self.store / "felt" / "snapshots")

    def step(self) -> None:
        self.run.begin_step()
        self.trainer.step()
        self.run.end_step(self.trainer.batch)

    def save(self) -> None:
        self.saved_step = self.run.step
        self.run.snapshot("periodic")

    def durable(self) -> float:
        return self.watch.wait_for(self.saved_step)

    def close(self) -> None:
        self.run.close()
        self.watch.stop()


class Watch:
    """Notes when each snapshot's manifest appears (burst commits it last, durably)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.seen = folder, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            if self.folder.is_dir():
                for path in self.folder.glob("*.json"):
                    step = int(path.stem)
                    self.seen.setdefault(step, time.monotonic())

    def wait_for(self, step: int, timeout: float = 300.0) -> float:
        deadline = time.monotonic() + timeout
        while step not in self.seen:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_felt: burst's snapshot of step {step} never committed")
            time.sleep(0.005)
        return self.seen[step]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


FACTORIES: dict[str, Callable[[Trainer, Path], Method]] = {
    "burst": Burst,
    "burst-normal-priority": lambda t, d: Burst(t, d, idle=False),
    "dcp.async_save": DcpAsync,
    "accelerate": Accelerate,
    "torch.save": TorchSave,
}


def timed_steps(method: Method, count: int, checkpoint: bool
                ) -> tuple[float, list[float], list[float]]:
    """``count`` steps, with ``checkpoint`` one after every ``EVERY``-th: total seconds,
    each checkpoint call's stall, and when each was asked for."""
    began = time.monotonic()
    stalls, asked = [], []
    for index in range(count):
        method.step()
        if checkpoint and index % EVERY == 0:
            called = time.monotonic()
            asked.append(called)
            method.save()
            stalls.append(time.monotonic() - called)
    return time.monotonic() - began, stalls, asked


def worker(name: str, small: bool, checkpoints: int) -> dict[str, float]:
    """One process, one method: warm up, plain, checkpointing, wait until durable, plain."""
    with tempfile.TemporaryDirectory(prefix=f"felt-{name}-", dir=os.environ.get("FELT_DIR")) \
            as tmp:
        trainer = Trainer(small)
        method = FACTORIES[name](trainer, Path(tmp))
        timed_steps(method, 2, checkpoint=True)  # warm up, with one checkpoint
        method.durable()
        plain = EVERY * 2
        first, _, _ = timed_steps(method, plain, checkpoint=False)
        # each checkpoint's step and the steps up to the next; after the last, as many
        # again: what an asynchronous save still does then is charged too
        steps = EVERY * (checkpoints + 1)
        total, stalls, asked = timed_steps(method, steps, checkpoint=True)
        total_stalls, asked = stalls[:checkpoints], asked[:checkpoints]
        durable = method.durable() - asked[-1]
        second, _, _ = timed_steps(method, plain, checkpoint=False)
        method.close()
        step = (first + second) / (2 * plain)
        return {"step": step, "lost": (total - steps * step) / checkpoints,
                "stall": statistics.mean(total_stalls), "durable": durable,
                "state_bytes": trainer.state_bytes()}


def dd_floor(size: int, folder: str | None) -> float:
    """Seconds ``dd conv=fsync`` takes to write ``size`` bytes to ``folder``'s disk."""
    with tempfile.TemporaryDirectory(prefix="felt-dd-", dir=folder) as tmp:
        began = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={tmp}/floor", "bs=4M",
                        f"count={max(1, size >> 22)}", "conv=fsync"], check=True,
                       capture_output=True)
        return time.monotonic() - began


def load() -> str:
    """The 1-minute load average: how shared the machine was while measuring."""
    return f"{os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=3, help="per round and method")
    parser.add_argument("--small", action="store_true", help="a small model: a quick run")
    parser.add_argument("--only", nargs="*", choices=METHODS, default=list(METHODS))
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, alike in every method's process (a "
                        "library that changes them would otherwise change the step)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("BURST_WHEELS", "none")
    if args.worker:
        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.small, args.checkpoints)))
        return
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.only}
    loads = [load()]
    for index in range(args.rounds):
        names = args.only[index % len(args.only):] + args.only[:index % len(args.only)]
        for name in names:
            command = [sys.executable, __file__, "--worker", name,
                       "--checkpoints", str(args.checkpoints), "--threads", str(args.threads)] + (["--small"] if args.small else [])
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"bench_felt: {name} failed:\n{done.stderr[-2000:]}")
            out = done.stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
            loads.append(load())
    size = next(iter(results.values()))[0]["state_bytes"]
    floor = dd_floor(size, os.environ.get("FELT_DIR"))
    report(results, size, floor, loads, args.json)


def report(results: dict[str, list[dict[str, float]]], size: int, floor: float,
           loads: list[str], as_json: bool) -> None:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def spread(name: str, key: str) -> str:
        values = [r[key] for r in results[name]]
        return f"{min(values):.2f}-{max(values):.2f}"

    if as_json:
        print(json.dumps({"results": results, "floor": floor, "loads": loads}, indent=1))
        return
    print(f"state {size / (1 << 30):.2f} GiB; dd conv=fsync floor {floor:.2f} s; "
          f"load average (1 min) per process: {' '.join(loads)}")
    print(f"{'method':<22} {'step s':>7} {'lost/ckpt s':>13} {'stall s':>11} {'durable s':>11}"
          "   (medians; min-max over rounds)")
    for name in results:
        print(f"{name:<22} {med(name, 'step'):>7.3f} {med(name, 'lost'):>6.2f} "
              f"[{spread(name, 'lost')}] {med(name, 'stall'):>5.2f} [{spread(name, 'stall')}] "
              f"{med(name, 'durable'):>5.2f} [{spread(name, 'durable')}]")
    if "burst" in results and "dcp.async_save" in results:
        dcp = med("dcp.async_save", "lost")
        ratio = med("burst", "lost") / dcp if dcp > 0 else float("nan")
        print(f"burst lost / dcp.async_save lost: {ratio:.2f}x (target <= 0.5x); burst durable"
              f" / dd floor: {med('burst', 'durable') / floor:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()

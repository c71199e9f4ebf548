"""A small CUDA training script for the GPU checks: real OOMs, AMP, exact resume.

Run as ``python tests/gpu/gpu_train.py --records F [--oom forward|optimizer --oom-step N
--oom-once MARKER] [--amp bf16|fp16] [--kill-at STEP]``. It appends, per optimizer step,
the step, the micro-batch size, the sample indices and the loss bits to ``--records``.

The OOMs are real: the script asks the CUDA caching allocator for twice the card, which
raises ``torch.cuda.OutOfMemoryError`` from the driver, in the first micro-batch's forward
or in ``optimizer.step()`` (a step pre-hook). ``--oom-once`` names a file created when the
OOM fires, so the retried attempt trains on, as it would after a real transient OOM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import burst


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--records", required=True)
    p.add_argument("--store", default=None)
    p.add_argument("--oom", choices=("forward", "optimizer"), default=None)
    p.add_argument("--oom-step", type=int, default=5)
    p.add_argument("--oom-once", default=None)
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None)
    p.add_argument("--kill-at", type=int, default=-1, help="SIGKILL in this step")
    p.add_argument("--epochs", type=int, default=2)
    return p.parse_args()


def oom_now(marker: str | None) -> None:
    """Ask the driver for twice the card: a real CUDA out-of-memory error."""
    if marker is not None:
        if Path(marker).exists():
            return
        Path(marker).touch()
    total = torch.cuda.mem_get_info()[1]
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")


def bits(value: float) -> str:
    return struct.pack(">d", value).hex()


def main() -> None:
    args = parse()
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(96, 16, generator=gen), torch.randint(0, 4, (96,),
                                                                           generator=gen),
                         torch.arange(96))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(64, 4)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12, growth_interval=2,
                                  enabled=args.amp == "fp16")
    run = burst.Run(store=args.store, global_batch=16, micro_batch=8, shadow_every=1,
                    persist_every=2, amp=args.amp, keep=100)
    run.attach(model, optimizer, scaler=scaler)
    if args.oom == "optimizer":
        optimizer.register_step_pre_hook(
            lambda *_: oom_now(args.oom_once) if run.step + 1 == args.oom_step else None)
    loader = DataLoader(data, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(data, seed=3))
    with open(args.records, "a") as records:
        for _ in run.epochs(args.epochs):
            for step in run.steps(loader):
                indices, total = [], 0.0
                for micro, (x, y, index) in enumerate(step):
                    if step.index == args.kill_at and micro == 1:
                        run.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
                    if args.oom == "forward" and step.index == args.oom_step and micro == 0:
                        oom_now(args.oom_once)
                    with run.autocast():
                        out = model(x.cuda())
                        loss = torch.nn.functional.cross_entropy(out.float(), y.cuda())
                    loss = loss * step.weight(len(x))
                    scaler.scale(loss).backward()
                    indices += index.tolist()
                    total += loss.item()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                records.write(json.dumps({"step": step.index, "micro": run.micro_batch,
                                          "indices": indices, "loss": bits(total)}) + "\n")
                records.flush()
    run.close()


if __name__ == "__main__":
    main()

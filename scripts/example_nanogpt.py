"""karpathy/nanoGPT's training loop, shrunk, with burst added the way docs/own-loop.md says.

No DataLoader: ``get_batch`` draws ``torch.randint`` offsets into a memory-mapped token
file (``--data DIR/train.bin``, uint16, as nanoGPT's ``prepare.py`` writes it), the model
has dropout, and each optimizer step accumulates two micro-batches. burst calls
``get_batch`` (``run.batches``), drawing the next batch ahead as nanoGPT does, from a
random stream of its own; the snapshot keeps that stream's place, so a killed and
restarted run ends bit-identical to one that never stopped.

``--prefetch old`` runs nanoGPT's loop as it is written (the first batch drawn before the
loop, each next one right after the forward pass) with burst's step hooks around it:
burst then warns that random numbers are drawn outside its steps, and a resumed run is
not the same run. ``--write-data N`` writes a token file of N tokens and exits.

Per step, ``--records`` gets the loss bits (JSONL, flushed line by line); ``--final``
gets the final model and optimizer state.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import burst

VOCAB, BLOCK, EMBD = 64, 16, 32


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention and an MLP, with dropout."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn, self.proj = nn.Linear(EMBD, 3 * EMBD), nn.Linear(EMBD, EMBD)
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD),
                                 nn.Dropout(dropout))
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn(self.ln1(x)).split(EMBD, dim=2)
        heads = [t.view(*x.shape[:2], 2, EMBD // 2).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
        self.drop, self.block = nn.Dropout(dropout), Block(dropout)
        self.ln_f, self.head = nn.LayerNorm(EMBD), nn.Linear(EMBD, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        logits = self.head(self.ln_f(self.block(x)))
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def write_data(path: Path, tokens: int) -> None:
    """A token file as nanoGPT's prepare.py leaves it: uint16 ids, raw."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, VOCAB, tokens, dtype=np.uint16)
    ids.tofile(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", default=None, help="default: $BURST_RUN_ID")
    p.add_argument("--store", default=None, help="default: $BURST_STORE or ./.burst")
    p.add_argument("--data", type=Path, default=Path("data"), help="holds train.bin")
    p.add_argument("--write-data", type=int, default=0, help="write N tokens and exit")
    p.add_argument("--records", default=os.devnull)
    p.add_argument("--final", default=None)
    p.add_argument("--max-iters", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--persist-every", type=int, default=3)
    p.add_argument("--prefetch", choices=("burst", "old"), default="burst")
    args = p.parse_args(argv)
    if args.write_data:
        write_data(args.data / "train.bin", args.write_data)
        return

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        # nanoGPT recreates the memmap every batch to avoid a memory leak
        data = np.memmap(args.data / f"{split}.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - BLOCK, (args.batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + BLOCK].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + BLOCK].astype(np.int64))
                         for i in ix])
        return x, y

    torch.manual_seed(1337)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))

    def lr_at(it: int) -> float:  # nanoGPT's warmup, then cosine decay
        warmup = 2
        if it < warmup:
            return 1e-3 * (it + 1) / (warmup + 1)
        ratio = (it - warmup) / max(1, args.max_iters - warmup)
        return 1e-4 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-3 - 1e-4)

    run = burst.Run(args.run_id, store=args.store,  # burst
                    global_batch=args.batch_size * args.accumulation,
                    micro_batch=args.batch_size, shadow_every=1,
                    persist_every=args.persist_every, keep=100)
    run.attach(model, optimizer)  # burst: restore-or-start
    with open(args.records, "a") as records:
        def log(step: int, losses: list[torch.Tensor]) -> None:
            loss = sum(losses)
            records.write(json.dumps({"step": step, "loss": float(loss).hex()}) + "\n")
            records.flush()

        if args.prefetch == "burst":
            for step in run.batches(lambda: get_batch("train"), steps=args.max_iters):  # burst
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step.index - 1)
                losses = []
                for X, Y in step:  # the step's micro-batches, drawn by burst
                    _, loss = model(X, Y)
                    loss = loss / step.micro_batches
                    loss.backward()
                    losses.append(loss.detach())
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                log(step.index, losses)
        else:  # nanoGPT's loop as written, with burst's step hooks around each step
            X, Y = get_batch("train")  # fetch the very first batch
            while run.step < args.max_iters:
                run.begin_step()
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(run.step)
                losses = []
                for micro in range(args.accumulation):
                    run.before_micro_batch(micro)  # burst: BURST_FAULT drills
                    _, loss = model(X, Y)
                    loss = loss / args.accumulation
                    X, Y = get_batch("train")  # prefetch the next batch
                    loss.backward()
                    losses.append(loss.detach())
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                log(run.step + 1, losses)
                run.end_step(run.global_batch)
    run.close()  # burst: final snapshot
    if args.final:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   args.final)


if __name__ == "__main__":
    main()

"""The example training loop on any number of ranks: plain, DDP or FSDP2; the scale-out
tests run it in one process or under ``python -m torch.distributed.run``.

Each rank appends, per optimizer step, the sample indices it consumed, its share of the
loss (bits) and one draw from its torch generator (bits) to ``<records>.rank<R>``, one
flushed JSON line per step, so a SIGKILL loses nothing already recorded. The final
model and optimizer state is the run's last snapshot (``run.close()``), which holds them
in the same layout whatever the world size, so runs on different world sizes compare
directly.
"""

import argparse
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import burst
import burst.parallel


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


def build(parallel: str) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    return model


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
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    group = burst.parallel.init_from_env()
    if group.world_size > 1 and args.parallel == "none":
        raise SystemExit("several ranks need --parallel ddp or fsdp")

    data = burst.SeededDataset(NoisyPairs(args.samples), seed=7)
    model = build(args.parallel)
    torch.manual_seed(1000 + group.rank)  # each rank its own stream (what the draws record)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    run = burst.Run(args.run_id, store=args.store, global_batch=args.global_batch,
                    micro_batch=args.micro_batch, shadow_every=1, persist_every=3, keep=100)
    report = run.attach(model, optimizer, scheduler)
    if report:
        print(f"rank {run.rank}: {report}", flush=True)
    loader = DataLoader(data, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(data, seed=3))
    kill_step, kill_micro = map(int, args.kill_at.split(":")) if args.kill_at else (-1, -1)

    with open(f"{args.records}.rank{run.rank}", "a") as records:
        for epoch in run.epochs(args.epochs):
            for step in run.steps(loader):
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
    run.close()  # returns on every rank once rank 0 has stored the final snapshot
    if dist.is_initialized():
        # torch 2.13's gloo process group can deadlock in its destructor at interpreter
        # teardown (it joins its worker thread while holding the GIL that thread needs
        # to free a finished collective's tensors); everything is stored and flushed.
        os._exit(0)


if __name__ == "__main__":
    main()

"""A small but complete training loop with burst added; the demo and the exact-resume tests run it.

It records, per optimizer step, the loss bits and the sample indices consumed, appending
to a JSONL file and flushing each line so a SIGKILL loses nothing already recorded. It
can kill itself with SIGKILL at a chosen (step, micro-batch), i.e. mid-accumulation.
"""

import argparse
import json
import os
import signal

import torch
from torch.utils.data import DataLoader, Dataset

import burst


class NoisyPairs(Dataset):
    """Inputs get fresh random noise on every read: augmentation randomness to replay."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 12, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(12), self.y[i], int(i)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", default=None, help="default: $BURST_RUN_ID")
    p.add_argument("--store", default=None, help="default: $BURST_STORE or ./.burst")
    p.add_argument("--records", default=os.devnull, help="per-step JSONL (tests compare it)")
    p.add_argument("--final", default=None, help="torch.save the final state here")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--loader-drop-last", action="store_true")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--scaler", action="store_true")
    p.add_argument("--persist-every", type=int, default=3)
    p.add_argument("--shadow-every", type=int, default=1)
    p.add_argument("--flush", action="store_true",
                   help="wait for each snapshot write (tests: makes the resume point exact)")
    p.add_argument("--kill-at", default="", help="STEP:MICRO: SIGKILL before that micro-batch")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    data = burst.SeededDataset(NoisyPairs(args.samples), seed=7)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
        torch.nn.Dropout(0.3), torch.nn.Linear(32, 3),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) if args.scaler else None

    run = burst.Run(args.run_id, store=args.store, global_batch=args.global_batch,
                    micro_batch=args.micro_batch, shadow_every=args.shadow_every,
                    persist_every=args.persist_every, keep=100)
    report = run.attach(model, optimizer, scheduler, scaler)
    if report:
        print(report, flush=True)
    sampler = burst.ResumableSampler(data, seed=3, shuffle=not args.no_shuffle,
                                     drop_last=args.drop_last)
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=sampler,
                        num_workers=args.workers, drop_last=args.loader_drop_last)
    kill_step, kill_micro = (map(int, args.kill_at.split(":")) if args.kill_at else (-1, -1))

    with open(args.records, "a") as records:
        for epoch in run.epochs(args.epochs):
            for step in run.steps(loader):
                indices, total = [], 0.0
                for micro, (x, y, index) in enumerate(step):
                    if step.index == kill_step and micro == kill_micro:
                        run.flush()  # the snapshot being written must exist; then die hard
                        os.kill(os.getpid(), signal.SIGKILL)
                    loss = torch.nn.functional.cross_entropy(model(x), y) * step.weight(len(x))
                    (scaler.scale(loss) if scaler else loss).backward()
                    indices += index.tolist()
                    total += loss.item()
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                run.log(loss=total)  # for burst report
                if args.flush:
                    run.flush()
                records.write(json.dumps({"step": step.index, "epoch": epoch,
                                          "loss": total.hex(), "indices": indices}) + "\n")
                records.flush()
    run.close()
    if args.final:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict() if scaler else None,
                    "rng": torch.get_rng_state()}, args.final)


if __name__ == "__main__":
    main()

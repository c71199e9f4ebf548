"""HF Accelerate with burst: the usual ``accelerator.prepare`` / ``accumulate`` loop, with
the lines marked ``# burst`` added. Run it again after a crash and it continues at the
exact sample. tests/training/test_integrations.py kills it (``BURST_FAULT=kill@N``) and checks
the resumed run against an uninterrupted one."""

import argparse
import json

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst.integrations.accelerate import BurstAccelerate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", default=None)
    p.add_argument("--store", default=None)
    p.add_argument("--records", default=None)
    p.add_argument("--final", default=None)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g),
                         torch.arange(96))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.8)

    run = burst.Run(args.run_id, store=args.store, global_batch=16, micro_batch=8,  # burst
                    shadow_every=1, persist_every=1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=run.accumulation)
    loader = DataLoader(data, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(data, seed=3))  # burst
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loop = BurstAccelerate(run, accelerator)  # burst
    loop.attach(model, optimizer, scheduler)  # burst: restore-or-start

    seen: dict[int, int] = {}
    for _epoch in run.epochs(args.epochs):  # burst
        for x, y, index in loop.batches(loader):  # burst: was `for ... in loader`
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            loop.log(loss)  # burst: for `burst report`
            if args.records:  # test bookkeeping: which samples, in which step
                step = run.step + 1  # the step in progress (counted when it ends)
                micro = seen[step] = seen.get(step, -1) + 1
                with open(args.records, "a") as out:
                    out.write(json.dumps({"step": step, "micro": micro,
                                          "indices": index.tolist()}) + "\n")
    run.close()  # burst
    if args.final:
        torch.save({"model": accelerator.unwrap_model(model).state_dict(),
                    "optimizer": optimizer.optimizer.state_dict(),
                    "scheduler": scheduler.scheduler.state_dict(), "step": run.step,
                    "rng": torch.get_rng_state()}, args.final)


if __name__ == "__main__":
    main()

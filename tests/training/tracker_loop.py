"""A plain burst loop that logs to TensorBoard, W&B (offline) and MLflow (a local file
store) through ``run.trackers``; tests/training/test_trackers.py kills it twice
(``BURST_FAULT``) and reads what each tracker holds.

``python tests/training/tracker_loop.py --run-id R --store DIR --logs DIR``"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

import burst

p = argparse.ArgumentParser()
p.add_argument("--run-id", required=True)
p.add_argument("--store", required=True)
p.add_argument("--logs", required=True)
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
data = TensorDataset(torch.randn(48, 6, generator=g), torch.randn(48, 1, generator=g))
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
run = burst.Run(args.run_id, store=args.store, global_batch=8, micro_batch=4,
                shadow_every=1, persist_every=2)  # the dead process logs past a snapshot
run.attach(model, optimizer)
run.trackers.tensorboard(os.path.join(args.logs, "tensorboard"))
run.trackers.wandb(project="burst-test", dir=args.logs, mode="offline")
run.trackers.mlflow("file://" + os.path.join(args.logs, "mlruns"), experiment="burst-test")
loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
for epoch in run.epochs(args.epochs):
    for step in run.steps(loader):
        total = 0.0
        for x, y in step:
            loss = torch.nn.functional.mse_loss(model(x), y) * step.weight(len(x))
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        run.trackers.log({"loss": total, "epoch": epoch}, step=step.index)
run.close()

"""PyTorch Lightning with burst: the LightningModule is unchanged; the Trainer gets a
``BurstCallback`` (lines marked ``# burst``). Run it again after a crash and it continues
at the exact sample. tests/training/test_integrations.py kills it (``BURST_FAULT=kill@N``) and
checks the resumed run against an uninterrupted one."""

import argparse
import json

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst.integrations.lightning import BurstCallback


class Classifier(L.LightningModule):
    def __init__(self, records: str | None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
        self.records = records
        self.run: burst.Run | None = None
        self.seen: dict[int, int] = {}

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        if self.records and self.run is not None:  # test bookkeeping: which samples, when
            step = self.run.step + 1
            micro = self.seen[step] = self.seen.get(step, -1) + 1
            with open(self.records, "a") as out:
                out.write(json.dumps({"step": step, "micro": micro,
                                      "indices": index.tolist()}) + "\n")
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.8)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


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
    run = burst.Run(args.run_id, store=args.store, global_batch=16, micro_batch=8,  # burst
                    shadow_every=1, persist_every=1)
    sampler = burst.ResumableSampler(data, seed=3)  # burst: exact data position
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=sampler)
    model = Classifier(args.records)
    model.run = run
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1,
                        accumulate_grad_batches=run.accumulation,  # burst
                        callbacks=[BurstCallback(run, sampler)],  # burst
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if args.final:
        optimizer = trainer.optimizers[0]
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
                    "step": trainer.global_step, "epoch": trainer.current_epoch,
                    "rng": torch.get_rng_state()}, args.final)


if __name__ == "__main__":
    main()

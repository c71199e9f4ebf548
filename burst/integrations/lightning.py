"""A Lightning callback: burst snapshots, exact data position and failover for a
``Trainer`` loop, with the ``LightningModule`` unchanged.

::

    run = burst.Run("my-run", global_batch=64, micro_batch=16)
    sampler = burst.ResumableSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=run.micro_batch, sampler=sampler)
    trainer = L.Trainer(max_epochs=3, accumulate_grad_batches=run.accumulation,
                        callbacks=[BurstCallback(run, sampler)])
    trainer.fit(model, loader)       # run it again after a crash: it continues exactly

Lightning restores only from its own (pickled) checkpoints and restarts a half-finished
epoch from its first batch. This callback instead restores burst's snapshot when the fit
starts, moves Lightning's epoch and step counters there, and starts the sampler at the
next unconsumed sample. Per-sample randomness must not use the global RNG while loading
(wrap the dataset in ``burst.SeededDataset``), because Lightning fetches a batch ahead.
"""

from __future__ import annotations

import math
from typing import Any

from burst.errors import ConfigError
from burst.integrations.loop import ForeignLoop
from burst.state import rng
from burst.training import failure
from burst.training.run import Run

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone package
    # the same classes under the older package's name
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[assignment]


class BurstCallback(Callback):
    """Keeps ``run`` in step with the Trainer: restore on fit start, count steps, snapshot,
    and turn a CUDA OOM or GPU failure into burst's emergency snapshot and exit code."""

    def __init__(self, run: Run, sampler: Any) -> None:
        self.run = run
        self.loop = ForeignLoop(run)
        self.loop.use_sampler(sampler)
        self._resumed_rng: dict | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _check_trainer(trainer, self.run)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        report = self.run.attach(pl_module, optimizer, scheduler)
        self.loop.use_sampler(self.loop.sampler)  # check it against the snapshot's data
        if report is not None:
            self.loop.roll_over_finished_epoch()
        # Lightning creates the first iterator (one RNG draw) before training starts; the
        # generators as attach left them (restored, or fresh) are put back right before
        # the first batch, so a fresh run and a resumed one start their steps alike
        self._resumed_rng = rng.capture()
        self.loop.position()  # before Lightning's setup creates the first iterator

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _set_progress(trainer, self.run.epoch, self.run.step)
        _size_epochs(trainer, self.loop, self.run)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.loop.position(trainer.train_dataloader)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._resumed_rng is not None:
            rng.restore(self._resumed_rng)
            self._resumed_rng = None
        self.loop.before_batch()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.loop.after_batch(batch, loss)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.loop.end_epoch()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule,
                     exception: BaseException) -> None:
        if failure.classify(exception) is not None:
            raise SystemExit(self.run.recover(exception))


def _check_trainer(trainer: Trainer, run: Run) -> None:
    if trainer.accumulate_grad_batches != run.accumulation:
        raise ConfigError(f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) "
                          f"but the run accumulates {run.accumulation}: pass "
                          "accumulate_grad_batches=run.accumulation")
    if len(trainer.optimizers) > 1:
        raise ConfigError("BurstCallback supports one optimizer")
    if trainer.world_size != run.world_size:
        raise ConfigError(f"the Trainer has {trainer.world_size} processes, the run "
                          f"{run.world_size}")


def _size_epochs(trainer: Trainer, loop: ForeignLoop, run: Run) -> None:
    """Lightning sized every epoch from the sampler's length when the fit started, which
    after a resume is what is left of the current epoch; later epochs are whole again."""
    loader = trainer.train_dataloader
    if loop.sampler is None or trainer.limit_train_batches != 1.0 or loader is None or \
            getattr(loader, "batch_size", None) is None:
        return  # the user limits the epoch, or the loader is not a plain DataLoader
    samples = loop.sampler.epoch_length()
    whole = samples // run.micro_batch if loader.drop_last else math.ceil(samples / run.micro_batch)
    trainer.fit_loop.max_batches = whole
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    if combined is not None and combined.limits is not None:
        combined.limits = [whole] * len(combined.limits)


def _set_progress(trainer: Trainer, epoch: int, step: int) -> None:
    """Move Lightning's counters to the restored epoch and optimizer step, so max_epochs,
    max_steps, schedulers and loggers continue where the snapshot was taken."""
    fit = trainer.fit_loop
    # declared ready-completed trackers, the fit loop's are processed ones (with started)
    counters: tuple[Any, ...] = (fit.epoch_progress.current, fit.epoch_progress.total)
    for counter in counters:
        counter.ready = counter.started = counter.processed = counter.completed = epoch
    epoch_loop = fit.epoch_loop
    for total in (epoch_loop.automatic_optimization.optim_progress.optimizer.step.total,
                  epoch_loop.manual_optimization.optim_step_progress.total):
        total.ready = total.completed = step
    epoch_loop._batches_that_stepped = step

"""An Accelerate helper: burst snapshots, exact data position and failover for a loop
written with ``accelerate.Accelerator``, changed in two lines.

::

    run = burst.Run("my-run", global_batch=64, micro_batch=16)
    accelerator = Accelerator(gradient_accumulation_steps=run.accumulation)
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loop = BurstAccelerate(run, accelerator)
    loop.attach(model, optimizer, scheduler)                # restore-or-start
    for epoch in run.epochs(3):
        for batch in loop.batches(loader):                  # was: for batch in loader
            with accelerator.accumulate(model):
                loss = ...
                accelerator.backward(loss)
                optimizer.step(); scheduler.step(); optimizer.zero_grad()
            loop.log(loss)                                  # optional: for burst report
    run.close()

Accelerate decides when the optimizer really steps (``accumulate``); burst sees that
step through the optimizer's hooks, counts the samples the step consumed, and
snapshots between steps, so a resumed run starts at the next unconsumed sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from burst.errors import ConfigError
from burst.integrations.loop import ForeignLoop, find_sampler
from burst.state.capture import RestoreReport
from burst.training.run import Run


class BurstAccelerate:
    """Connects a ``Run`` to an ``Accelerator`` and to the prepared objects."""

    def __init__(self, run: Run, accelerator: Any) -> None:
        steps = getattr(accelerator, "gradient_accumulation_steps", 1)
        if steps != run.accumulation:
            raise ConfigError(f"Accelerator(gradient_accumulation_steps={steps}) but the run "
                              f"accumulates {run.accumulation}: pass "
                              "gradient_accumulation_steps=run.accumulation")
        if accelerator.num_processes != run.world_size:
            raise ConfigError(f"the Accelerator has {accelerator.num_processes} processes, "
                              f"the run {run.world_size}")
        self.run, self.accelerator = run, accelerator
        self.loop = ForeignLoop(run)
        self._loss: Any = None

    def attach(self, model: Any, optimizer: Any = None, scheduler: Any = None
               ) -> RestoreReport | None:
        """Register the prepared objects (burst reaches through Accelerate's wrappers to
        the real ones) and restore the newest snapshot, if any."""
        optimizer = getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer
        scheduler = getattr(scheduler, "scheduler", scheduler)  # AcceleratedScheduler
        scaler = getattr(self.accelerator, "scaler", None)
        return self.run.attach(self.accelerator.unwrap_model(model), optimizer, scheduler,
                               scaler)

    def batches(self, loader: Iterable) -> Iterator[Any]:
        """The loader's micro-batches from the next unconsumed sample of this epoch."""
        self.loop.use_sampler(find_sampler(loader))
        with self.loop.held_position(loader):
            for batch in loader:
                self.loop.before_batch()
                yield batch
                loss, self._loss = self._loss, None
                self.loop.after_batch(batch, loss)

    def log(self, loss: Any) -> None:
        """Give the micro-batch's loss to ``burst report`` (averaged over the step)."""
        self._loss = loss

"""A ``Run`` driven by a loop that burst does not own (Lightning's, Accelerate's).

``Run.steps`` counts optimizer steps itself because it hands out the micro-batches. A
framework's loop hands them out instead, so the adapters report each micro-batch here
and this class keeps the run's counters, step boundaries, fault injection and
snapshots exactly as ``Run.steps`` would, through the run's public hooks for foreign
loops (``Run.adopt_sampler``, ``begin_step``, ``before_micro_batch``, ``end_step``...),
so the adapters stay small.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from burst.errors import ConfigError
from burst.state.rng import derive_seed
from burst.training.run import Run
from burst.training.sampler import ResumableSampler


class ForeignLoop:
    """Counts micro-batches into optimizer steps for ``run``; one per training process."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.sampler: ResumableSampler | None = None
        self._samples = 0  # of the optimizer step in progress
        self._micro = 0
        self.step_values: list[float] = []  # per-micro-batch losses of that step

    def use_sampler(self, sampler: object) -> ResumableSampler:
        """Adopt the loader's sampler: check it is the snapshot's data, give it the layout."""
        self.sampler = self.run.adopt_sampler(sampler)
        return self.sampler

    def adopted(self) -> ResumableSampler:
        """The sampler :meth:`use_sampler` adopted (an adapter's loop runs only after it)."""
        if self.sampler is None:
            raise ConfigError("call use_sampler() first")
        return self.sampler

    def position(self, loader: object | None = None) -> None:
        """Point the sampler at the run's next unconsumed sample; give the loader its own
        seeded generator so creating its iterator never draws from the training RNG."""
        run, sampler = self.run, self.adopted()
        sampler.set_epoch(run.epoch, start=run.samples_in_epoch)
        loader = getattr(loader, "base_dataloader", loader)  # Accelerate's adapter wraps one
        sampler.follow(loader)
        if loader is not None and hasattr(loader, "generator"):
            loader.generator = torch.Generator().manual_seed(
                derive_seed("loader", run.seed, run.epoch, bits=63))

    @contextlib.contextmanager
    def held_position(self, loader: object) -> Iterator[None]:
        """While a framework iterates, its own ``sampler.set_epoch(n)`` (Accelerate counts
        epochs from zero in every process) must not move burst's position."""
        sampler = self.adopted()
        self.position(loader)
        epoch, start = sampler.epoch, sampler.start
        # pinned on the instance for the framework's iteration (deleted below)
        sampler.set_epoch = lambda *_args, **_kw: ResumableSampler.set_epoch(  # type: ignore[method-assign]
            sampler, epoch, start)
        try:
            yield
        finally:
            del sampler.set_epoch

    def roll_over_finished_epoch(self) -> None:
        """A snapshot taken at an epoch's last step resumes at the next epoch's start
        (for loops that finish epoch-level work, like LR steps, inside that last step)."""
        if self.sampler is not None:
            self.run.progress.finish_epoch_if_done(self.sampler.epoch_length())

    def before_batch(self) -> None:
        """At a step's first micro-batch, remember the boundary (for an OOM); fire faults."""
        if self._micro == 0:
            self.run.begin_step()
        self.run.before_micro_batch(self._micro)

    def after_batch(self, batch: Any, loss: Any = None) -> bool:
        """Count a finished micro-batch; True when it completed an optimizer step (which
        may snapshot, and may stop the process after a signal)."""
        run = self.run
        self._samples += batch_size(batch)
        self._micro += 1
        if loss is not None:
            self.step_values.append(float(loss.detach() if hasattr(loss, "detach") else loss))
        if not run.optimizer_stepped:
            return False
        if self.step_values:
            run.log(loss=sum(self.step_values) / len(self.step_values))
        samples, self._samples, self._micro, self.step_values = self._samples, 0, 0, []
        run.end_step(samples)
        return True

    def end_epoch(self) -> None:
        """The epoch is over: micro-batches that never reached an optimizer step are
        dropped (as ``Run.steps`` would), the next epoch starts at its first sample."""
        self._samples = self._micro = 0
        self.step_values = []
        self.run.abandon_step()
        self.run.progress.next_epoch()


def batch_size(batch: Any) -> int:
    """Samples in a micro-batch: the length of its first tensor, wherever it sits."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            try:
                return batch_size(item)
            except ConfigError:
                continue
    raise ConfigError(f"cannot tell how many samples a {type(batch).__name__} batch holds")


def find_sampler(loader: object) -> object | None:
    """The sampler behind a DataLoader, also when a framework rebuilt it around a batch
    sampler (Accelerate's DataLoaderShard, BatchSamplerShard)."""
    candidates = [getattr(loader, "sampler", None)]
    batch_sampler = getattr(loader, "batch_sampler", None)
    while batch_sampler is not None:
        candidates.append(getattr(batch_sampler, "sampler", None))
        batch_sampler = getattr(batch_sampler, "batch_sampler", None)
    for candidate in candidates:
        if isinstance(candidate, ResumableSampler):
            return candidate
    return candidates[0]

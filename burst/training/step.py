"""One optimizer step of a run: its micro-batches, and the weight each one's loss gets.

``Run.steps`` (a DataLoader's batches) and ``Run.batches`` (a batch source burst calls,
:mod:`burst.training.batches`) both hand these out; iterating one yields its
micro-batches, and the loop steps the optimizer after them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from burst.errors import ConfigError
from burst.store.retry import Thunk
from burst.training import faults


class Step:
    """One optimizer step: iterate it for its micro-batches, then step the optimizer."""

    def __init__(self, index: int, epoch: int, samples: int, micro_batches: int,
                 batches: Iterator[Any], injector: faults.Injector | None = None,
                 world_size: int = 1) -> None:
        self.index, self.epoch = index, epoch
        self.world_size = world_size
        self.samples, self.micro_batches = samples, micro_batches
        self._batches, self._injector = batches, injector
        self.consumed = 0

    def __iter__(self) -> Iterator[Any]:
        while self.consumed < self.micro_batches:
            if self._injector is not None:
                self._injector.before_micro_batch(self.index, self.consumed)
            batch = next(self._batches)
            self.consumed += 1
            yield batch

    def weight(self, micro_batch_samples: int) -> float:
        """Factor for a micro-batch's *mean* loss so the step's gradient is the mean over
        all of its samples, whatever the micro-batch split. ``samples`` counts all ranks;
        the factor includes the world size because DDP and FSDP *average* the ranks'
        gradients."""
        return micro_batch_samples * self.world_size / self.samples


def hand_out(step: Step, end: Thunk[None], abandon: Callable[[], None],
             stepped: Callable[[], bool]) -> Iterator[Step]:
    """Yield ``step`` to the loop, then count it (``end``) or drop it (``abandon``).

    A loop left inside the step (``break``, ``return``, an exception) counts it only if
    every micro-batch was used and the optimizer stepped (``stepped()``); a loop that goes
    on to the next step without using them all is a mistake, said in one line."""
    try:
        yield step
    except GeneratorExit:
        if step.consumed == step.micro_batches and stepped():
            end()
        else:
            abandon()
        raise
    if step.consumed != step.micro_batches:
        abandon()
        raise ConfigError(f"step {step.index} used {step.consumed} of its "
                          f"{step.micro_batches} micro-batches: iterate the whole step")
    end()

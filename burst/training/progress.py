"""Where a run stands: the optimizer steps and samples it consumed, and the phase of the
step in progress.

One counter for every loop that drives a run (``Run.steps``, ``Run.batches``, a foreign
framework's loop through ``burst.integrations.loop``), so an epoch rolls over the same way
whoever ends it, and a snapshot records the same four numbers a resume puts back.

The phase is an enum, not flags: a snapshot asked for mid-step waits for the boundary
(``IN_STEP``), a step is counted only once ``optimizer.step()`` ran (``STEPPED``), and
the failure guard asks whether the optimizer is halfway through its update
(``optimizing``: live state then is half-updated, whatever the phase).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class StepPhase(enum.Enum):
    """Where the loop is relative to an optimizer step."""

    BETWEEN = "between"  # at a step boundary: state is consistent, snapshots run now
    IN_STEP = "in-step"  # micro-batches run: a snapshot waits for the step's end
    STEPPED = "stepped"  # optimizer.step() ran: the step may be counted


@dataclass
class Progress:
    """The run's counters: what the optimizer has consumed, not what a loader prefetched."""

    step: int = 0  # optimizer steps completed
    epoch: int = 0
    samples_consumed: int = 0  # on all ranks, since the run began
    samples_in_epoch: int = 0  # the epoch's position a resume starts from
    total_epochs: int | None = None  # told by the loop (``Run.epochs``), for planners
    steps_per_epoch: int | None = None
    phase: StepPhase = StepPhase.BETWEEN
    optimizing: bool = False  # inside optimizer.step(), in a step or not

    def next_epoch(self) -> None:
        """The epoch is over: the next one starts at its first sample."""
        self.epoch += 1
        self.samples_in_epoch = 0

    def finish_epoch_if_done(self, epoch_length: int) -> None:
        """Roll over when the epoch's last step was consumed (a snapshot taken there then
        resumes at the next epoch's start)."""
        if self.samples_in_epoch and self.samples_in_epoch >= epoch_length:
            self.next_epoch()

    def count(self, samples: int) -> None:
        """A step finished, consuming ``samples`` on all ranks."""
        self.step += 1
        self.samples_consumed += samples
        self.samples_in_epoch += samples

    def restore(self, counters: dict[str, Any]) -> None:
        """Take a snapshot's counters."""
        self.step, self.epoch = counters["step"], counters["epoch"]
        self.samples_consumed = counters["samples_consumed"]
        self.samples_in_epoch = counters["samples_in_epoch"]

    def counters(self) -> dict[str, Any]:
        """What a snapshot's manifest records (``total_steps`` for planners)."""
        return {"step": self.step, "epoch": self.epoch,
                "samples_consumed": self.samples_consumed,
                "samples_in_epoch": self.samples_in_epoch,
                "total_steps": self.total_steps()}

    def total_steps(self) -> int | None:
        """Steps of the whole run, when the loop has said how many epochs."""
        if self.total_epochs is None or self.steps_per_epoch is None:
            return None
        return self.total_epochs * self.steps_per_epoch

    @property
    def in_step(self) -> bool:
        """Between ``begin_step`` and the step's end (counted or abandoned)."""
        return self.phase is not StepPhase.BETWEEN

    @property
    def stepped(self) -> bool:
        """Whether ``optimizer.step()`` ran in the step in progress."""
        return self.phase is StepPhase.STEPPED

    def begin_step(self) -> None:
        self.phase = StepPhase.IN_STEP

    def end_step(self) -> None:
        self.phase = StepPhase.BETWEEN

    def follow(self, optimizer: Any) -> tuple[Callable[[], None], ...]:
        """Learn the phase from ``optimizer.step()``'s hooks; returns their removers (a
        refused attach undoes them)."""
        return (optimizer.register_step_pre_hook(lambda *_: self.optimizer_started()).remove,
                optimizer.register_step_post_hook(lambda *_: self.optimizer_done()).remove)

    def optimizer_started(self) -> None:
        self.optimizing = True

    def optimizer_done(self) -> None:
        """``optimizer.step()`` returned: a step in progress may now be counted."""
        self.optimizing = False
        if self.phase is StepPhase.IN_STEP:
            self.phase = StepPhase.STEPPED

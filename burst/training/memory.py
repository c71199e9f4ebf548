"""A run's memory at step boundaries: read the card, re-plan the micro-batch, apply rules.

``burst.training.memory_control`` decides (the controller, its candidates, the rules'
grammar); this part carries the decisions out for one run: it splits the loader's batches
into the micro-batch in force, remembers each size's peak for the planner, and returns the
layout and precision the next step runs with. The run stays the owner of both (it hands
them in and takes the new ones back), so nothing here edits the run behind its back.

One process only: ranks deciding apart would run different numbers of micro-batches and
hang in a collective.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from burst.state.amp import parse_amp
from burst.training import checkpointing, memory_control
from burst.training.layout import Layout


class MemoryManager:
    """The in-process memory re-plan of one run (off: ``target`` None or several ranks)."""

    def __init__(self, layout: Layout, target: float | None,
                 rules: tuple[str, ...] | list[str],
                 reader: memory_control.Reader | None,
                 record: Callable[..., None]) -> None:
        self.controller: memory_control.Controller | None = None
        if target is not None and layout.world_size == 1:
            sizes = memory_control.candidates(layout.global_batch, layout.world_size,
                                              layout.micro_batch)
            self.controller = memory_control.Controller(layout.micro_batch, sizes, target,
                                                        rules=rules)
        self.reader = reader or memory_control.cuda_reader
        self.rechunking = False  # run.steps() owns the micro-batches: it may re-plan them
        self.peaks: dict[str, int] = {}  # peak bytes on the card per micro-batch size
        self._record = record

    def alert(self) -> None:
        """A memory alert fired (any thread): the next boundary shrinks the micro-batch."""
        if self.controller is not None:
            self.controller.alert()

    def micro_batches(self, layout: Layout, share: int, batches: Iterator[Any]
                      ) -> tuple[int, Iterator[Any]]:
        """How many micro-batches this rank's ``share`` makes, and where they come from:
        the loader's batches as they are, or each split into the re-planned size."""
        if layout.micro_batch == layout.planned_micro:
            return math.ceil(share / layout.micro_batch), batches
        count = memory_control.micro_count(share, layout.planned_micro, layout.micro_batch)
        loader_batches = math.ceil(share / layout.planned_micro)
        return count, memory_control.rechunk(batches, loader_batches, layout.micro_batch)

    def record_peak(self, micro_batch: int) -> None:
        """The step's peak on the card, kept per micro-batch size (CUDA in use)."""
        key = str(micro_batch)
        peak = torch.cuda.max_memory_allocated()
        self.peaks[key] = max(self.peaks.get(key, 0), peak)

    def at_boundary(self, layout: Layout, amp: str | None, model: torch.nn.Module | None,
                    step: int) -> tuple[Layout, str | None]:
        """Read the card, apply due rules, switch micro-batch: the layout and precision
        the next step runs with."""
        controller = self.controller
        if controller is None or not self.rechunking:
            return layout, amp
        reading = self.reader()
        if reading is None and not controller.alerted:  # no card read, no alert: no change
            return layout, amp
        for rule in controller.rules_due(reading):
            amp = self._apply_rule(rule, reading, amp, model, step)
        decision = controller.decide(layout.micro_batch, reading)
        if decision is None:
            return layout, amp
        new = layout.with_micro(decision.new)
        self._record(memory_control.EVENT, step=step, reason=decision.reason,
                     old_micro=decision.old, new_micro=decision.new,
                     old_accumulation=layout.accumulation, new_accumulation=new.accumulation,
                     **_reading_fields(reading), predicted_bytes=decision.predicted)
        return new, amp

    def _apply_rule(self, rule: memory_control.Rule, reading: memory_control.Reading | None,
                    amp: str | None, model: torch.nn.Module | None, step: int) -> str | None:
        if rule.key == "amp":
            old, amp = amp, parse_amp(rule.value)
            changed: dict[str, Any] = {"old": old, "new": amp}
        else:
            types = [t.strip() for t in rule.value.split(",") if t.strip()]
            changed = {"modules": checkpointing.wrap(model, types)}
        self._record(memory_control.RULE_EVENT, step=step, rule=rule.text,
                     action=rule.key, **changed, **_reading_fields(reading))
        return amp


def _reading_fields(reading: memory_control.Reading | None) -> dict[str, Any]:
    if reading is None:
        return {"peak_bytes": None, "total_bytes": None}
    return {"peak_bytes": reading.peak, "total_bytes": reading.total}

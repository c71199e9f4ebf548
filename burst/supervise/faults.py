"""Fault injection for tests and drills: real failures at a chosen optimizer step.

``BURST_FAULT`` holds ``KIND@STEP[:MICRO][/RANK]`` (several separated by commas); ``STEP``
is the optimizer step during which the fault fires (1-based, as ``Step.index``), ``MICRO``
the micro-batch within it, ``RANK`` the only rank it hits (torchrun's ``$RANK``; without
it, every rank). Kinds:

- ``oom``: a real ``torch.cuda.OutOfMemoryError`` while fetching a micro-batch (as if
  raised in the forward pass);
- ``oom-optimizer``: the same error from inside ``optimizer.step()``;
- ``sticky``: a sticky CUDA error ("an illegal memory access was encountered");
- ``kill``: SIGKILL to the process itself, mid-step, once the snapshot writes already in
  flight have landed (so a drill's recovery point does not depend on disk speed);
- ``term``: SIGTERM to the process itself, mid-step (a preemption notice).

A fault fires once per process, and only when the run has not already moved past that
step, so a restarted process that resumes beyond it trains on normally.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from burst.errors import ConfigError

ENV_FAULT = "BURST_FAULT"
KINDS = ("oom", "oom-optimizer", "sticky", "kill", "term")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    micro_batch: int = 0
    rank: int | None = None  # None: every rank


def parse(spec: str | None) -> list[Fault]:
    """Parse ``KIND@STEP[:MICRO][/RANK],...``; a typo is a clear error, not a silent no-op."""
    faults = []
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        kind, _, where = part.partition("@")
        where, slash, rank = where.partition("/")
        step, _, micro = where.partition(":")
        if kind not in KINDS or not step.isdigit() or (micro and not micro.isdigit()) \
                or (slash and not rank.isdigit()):
            raise ConfigError(f"bad fault {part!r}: use KIND@STEP[:MICRO][/RANK] with KIND "
                              f"one of {', '.join(KINDS)}")
        faults.append(Fault(kind, int(step), int(micro or 0), int(rank) if slash else None))
    return faults


class Injector:
    """Fires the configured faults at the matching points of the training loop."""

    def __init__(self, faults: list[Fault]) -> None:
        self.pending = list(faults)
        self.settle: Callable[[], None] | None = None  # waits for in-flight snapshot writes

    @classmethod
    def from_env(cls) -> Injector:
        """The faults for this process: those for every rank, and those for its own."""
        rank = int(os.environ.get("RANK") or 0)
        return cls([f for f in parse(os.environ.get(ENV_FAULT)) if f.rank in (None, rank)])

    def before_micro_batch(self, step: int, micro_batch: int) -> None:
        for fault in self._due(step, ("oom", "sticky", "kill", "term"), micro_batch):
            if fault.kind == "kill" and self.settle is not None:
                with contextlib.suppress(Exception):
                    self.settle()
            _fire(fault)

    def in_optimizer_step(self, step: int) -> None:
        for fault in self._due(step, ("oom-optimizer",), None):
            _fire(fault)

    def _due(self, step: int, kinds: tuple[str, ...], micro_batch: int | None) -> list[Fault]:
        due = [f for f in self.pending if f.kind in kinds and f.step == step
               and (micro_batch is None or f.micro_batch == micro_batch)]
        self.pending = [f for f in self.pending if f not in due]
        return due


def _fire(fault: Fault) -> None:
    import torch  # only a firing fault needs it: `burst drill --help` parses faults torch-free

    where = f"injected at step {fault.step}"
    if fault.kind in ("oom", "oom-optimizer"):
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB ({where})")
    if fault.kind == "sticky":
        error = getattr(torch, "AcceleratorError", RuntimeError)
        raise error(f"CUDA error: an illegal memory access was encountered ({where})")
    os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM)

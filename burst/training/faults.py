"""Fault injection for tests and drills: real failures at a chosen optimizer step.

``BURST_FAULT`` holds ``KIND@STEP[:MICRO][/RANK][+always]`` (several separated by commas); ``STEP``
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

A fault fires once per *run*: when it fires, the run records a ``fault-injected`` event
naming it (:data:`FIRED_EVENT`, before a ``kill`` or ``term`` lands), and a process of the
same run that finds that event in the run's history leaves the fault out
(:meth:`Injector.forget_fired`). So ``BURST_FAULT`` exported in the shell hits the first
attempt only, and the agent's retries (``retry-smaller``, ``restart``) train on, as they
would after a real OOM. ``+always`` asks for the old behaviour: the fault fires in every
process that reaches its step. Either way a fault fires only when the run has not
already moved past that step, so a process that resumes beyond it trains on normally.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from burst import events
from burst.contract import ENV_FAULT
from burst.errors import ConfigError

if TYPE_CHECKING:  # only a type: drills stay light to import
    from burst.store import Store

KINDS = ("oom", "oom-optimizer", "sticky", "kill", "term")
ALWAYS = "always"  # the option that makes a fault fire in every process, not once a run
FIRED_EVENT = "fault-injected"


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    micro_batch: int = 0
    rank: int | None = None  # None: every rank
    always: bool = False  # fire in every process of the run, not only the first

    @property
    def name(self) -> str:
        """The fault as a spec, without ``+always``: what the run's history records."""
        rank = "" if self.rank is None else f"/{self.rank}"
        return f"{self.kind}@{self.step}:{self.micro_batch}{rank}"


def parse(spec: str | None) -> list[Fault]:
    """Parse ``KIND@STEP[:MICRO][/RANK][+always],...``; a typo is a clear error, not a
    silent no-op."""
    faults = []
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        fault, plus, option = part.partition("+")
        kind, _, where = fault.partition("@")
        where, slash, rank = where.partition("/")
        step, _, micro = where.partition(":")
        if kind not in KINDS or not step.isdigit() or (micro and not micro.isdigit()) \
                or (slash and not rank.isdigit()) or (plus and option != ALWAYS):
            raise ConfigError(f"bad fault {part!r}: use KIND@STEP[:MICRO][/RANK][+{ALWAYS}] "
                              f"with KIND one of {', '.join(KINDS)}")
        faults.append(Fault(kind, int(step), int(micro or 0), int(rank) if slash else None,
                            always=bool(plus)))
    return faults


def fired(history: Iterable[dict]) -> set[str]:
    """The names of the faults a run's history (its events) says have fired."""
    return {str(e.get("fault")) for e in history if e.get("event") == FIRED_EVENT}


class Injector:
    """Fires the configured faults at the matching points of the training loop."""

    def __init__(self, faults: list[Fault]) -> None:
        self.pending = list(faults)
        self.settle: Callable[[], None] | None = None  # waits for in-flight snapshot writes
        self.on_fire: Callable[[Fault], None] | None = None  # records that a fault fired

    @classmethod
    def from_env(cls) -> Injector:
        """The faults for this process: those for every rank, and those for its own."""
        rank = int(os.environ.get("RANK") or 0)
        return cls([f for f in parse(os.environ.get(ENV_FAULT)) if f.rank in (None, rank)])

    def forget_fired(self, names: set[str]) -> None:
        """Leave out the one-shot faults the run has already fired (see :func:`fired`)."""
        self.pending = [f for f in self.pending if f.always or f.name not in names]

    def before_micro_batch(self, step: int, micro_batch: int) -> None:
        for fault in self._due(step, ("oom", "sticky", "kill", "term"), micro_batch):
            self._announce(fault)
            if fault.kind == "kill" and self.settle is not None:
                with contextlib.suppress(Exception):
                    self.settle()
            _fire(fault)

    def in_optimizer_step(self, step: int) -> None:
        for fault in self._due(step, ("oom-optimizer",), None):
            self._announce(fault)
            _fire(fault)

    def _announce(self, fault: Fault) -> None:
        """Record the firing first: a ``kill`` leaves no chance afterwards."""
        if self.on_fire is not None:
            with contextlib.suppress(Exception):
                self.on_fire(fault)

    def _due(self, step: int, kinds: tuple[str, ...], micro_batch: int | None) -> list[Fault]:
        if not self.pending:  # every micro-batch asks: a run without drills pays one test
            return []
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


def for_run(local: Store, store: Store, run_id: str, record: Callable[..., None],
            settle: Callable[[], None]) -> Injector:
    """The drills ``BURST_FAULT`` sets for this run's process, less the one-shot ones its
    history says already fired (one-shot per run, not per process: the local history is
    the main witness, the store's adds a node's); each one that fires is recorded.
    Nothing is read when no fault is set."""
    injector = Injector.from_env()
    injector.settle = settle
    injector.on_fire = lambda fault: record(FIRED_EVENT, fault=fault.name, kind=fault.kind,
                                            step=fault.step)
    if injector.pending:
        history = events.read(local, run_id)
        if store is not local:
            with contextlib.suppress(Exception):
                history += events.read(store, run_id)
        injector.forget_fired(fired(history))
    return injector

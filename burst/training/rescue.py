"""What a run's snapshots hold and say, and what its failure guard asks of it.

The guard (``burst.training.guard``) talks to this part, never to ``Run``: where the run
stands, its batch layout, the three ways to keep state a failure leaves trustworthy (the
live state as it was at the last step boundary, the newest RAM copy, the store's flush),
and its history. The snapshotter asks the same part for each capture's state and manifest
fields, so a periodic snapshot and an emergency one describe the run the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from burst.parallel import state as dist_state
from burst.parallel.group import Group
from burst.state import capture as state_mod
from burst.state.capture import Components
from burst.training.boundary import BoundaryCopies
from burst.training.forward import Forward
from burst.training.history import History
from burst.training.layout import Layout
from burst.training.memory import MemoryManager
from burst.training.progress import Progress
from burst.training.sidecar import Sidecar
from burst.training.snapshotter import Snapshotter, manifest_fields
from burst.training.subject import Subject


class Rescue:
    """The save side a failing process reaches (``guard.GuardedRun``), for one run."""

    step: Forward[int] = Forward("progress")
    in_optimizer_step: Forward[bool] = Forward("progress", "optimizing")
    components: Forward[Components] = Forward("subject")
    plan: Forward[Layout] = Forward("subject")
    rank: Forward[int] = Forward("plan")
    micro_batch: Forward[int] = Forward("plan")

    def __init__(self, subject: Subject, progress: Progress, group: Group,
                 boundary: BoundaryCopies, snapshots: Snapshotter, sidecar: Sidecar,
                 memory: MemoryManager, announce: Callable[[], None], history: History,
                 grace_seconds: float) -> None:
        self.subject, self.progress, self._group = subject, progress, group
        self._boundary, self._snapshots, self._sidecar = boundary, snapshots, sidecar
        self._memory, self._announce = memory, announce
        self.record_event = history  # rank 0 tells the story; every rank its failures
        self.grace_seconds = grace_seconds  # how long rank 0 waits for others' pieces

    def layout(self) -> dict[str, Any]:
        """The batch layout events and manifests record."""
        return self.subject.layout()

    def take_state(self) -> tuple[Any, Any, Any]:
        """The state to capture (on several ranks, this rank's piece)."""
        self._boundary.check(self.subject.components.model)
        return dist_state.capture(self.subject.components, self.subject.extra_state(),
                                  self._group)

    def describe(self, reason: str, frozen: bool = True) -> dict[str, Any]:
        """The manifest fields of a capture; ``frozen=False`` (a RAM shadow nobody may
        ever persist) leaves the environment freeze to ``Snapshotter.freeze_fields``,
        which the persister calls, so the training loop never waits for a freeze."""
        self._announce()
        meta = manifest_fields(
            reason, counters=self.progress.counters(), batch=self.layout(),
            amp=self.subject.precision(), sampler=self.subject.sampler_state(),
            peaks=self._memory.peaks, intervals=self._snapshots.policy.intervals())
        return self._snapshots.freeze_fields(meta) if frozen else meta

    def save_boundary(self, reason: str) -> int | None:
        """Snapshot the live state as it was at the last step boundary (after an OOM);
        return its step. On several ranks the other ranks may be stuck in a collective, so
        no collective capture is possible: every rank keeps its RAM shadow instead."""
        boundary = self._boundary
        if self.plan.world_size > 1 or boundary.rng_state is None:  # none marked
            return self.persist_shadow(reason)
        tree, live = state_mod.capture(self.subject.components, self.subject.extra_state(),
                                       rng_state=boundary.rng_state,
                                       model_buffers=boundary.buffers)
        self._snapshots.tiers.capture(self.step, tree, live, self.describe(reason),
                                      persist=True)
        return self.step

    def persist_shadow(self, reason: str) -> int | None:
        """Queue the newest RAM copy under ``reason`` without touching the device. On
        several ranks each rank queues its own piece, and rank 0 waits for the others' at
        most the grace period: a rank stuck in a collective never sends one, and the
        newest complete snapshot then stands."""
        self._sidecar.stop_staging()  # the emergency snapshot has the uplink to itself
        return self._snapshots.persist_shadow(reason, self.grace_seconds)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued snapshot is in the store; raise if one failed."""
        self._snapshots.flush(timeout)

"""What the planner needs to know about a run, taken from its snapshot and its events.

Reading the store is the caller's job; these functions take the parsed manifest and event
list, so the planner stays pure and tests build facts from plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from burst.contract import Reason
from burst.errors import SnapshotError
from burst.plan import memory


@dataclass(frozen=True)
class RunFacts:
    """The run as the planner sees it: batch layout, precision, memory, pace, progress."""

    run_id: str
    global_batch: int
    micro_batch: int
    world_size: int
    amp: str | None
    card: str  # the device name the snapshot was taken on ("cpu" for none)
    memory: memory.MemoryModel
    step: int = 0
    reason: str | None = None  # why the snapshot was taken: periodic, oom, gpu-failure...
    steps_per_second: float | None = None  # measured on ``card`` at ``world_size``
    total_steps: int | None = None

    @property
    def accumulation(self) -> int:
        return max(self.global_batch // (self.micro_batch * self.world_size), 1)

    @property
    def steps_remaining(self) -> int | None:
        return None if self.total_steps is None else max(self.total_steps - self.step, 0)

    @property
    def failed_oom(self) -> bool:
        return self.reason == Reason.OOM


def from_snapshot(manifest: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = (),
                  *, total_steps: int | None = None, reason: str | None = None) -> RunFacts:
    """Facts from a parsed manifest and the run's events (oldest first)."""
    batch = manifest.get("batch") or {}
    try:
        global_batch = int(batch["global"])
        micro = int(batch.get("micro") or global_batch)
        world = int(batch.get("world_size") or 1)
    except (KeyError, TypeError, ValueError):
        raise SnapshotError(f"snapshot of {manifest.get('run_id')!r} has no valid batch "
                            "layout (global, micro, world_size)") from None
    counters = manifest.get("counters") or {}
    return RunFacts(
        run_id=str(manifest.get("run_id", "?")),
        global_batch=global_batch,
        micro_batch=micro,
        world_size=world,
        amp=(manifest.get("amp") or {}).get("dtype"),
        card=str(manifest.get("card") or "cpu"),
        memory=memory.from_manifest(manifest),
        step=int(counters.get("step", manifest.get("step", 0))),
        reason=reason or manifest.get("reason"),
        steps_per_second=steps_per_second(events),
        total_steps=total_steps if total_steps is not None else _recorded_total(counters),
    )


def _recorded_total(counters: Mapping[str, Any]) -> int | None:
    total = counters.get("total_steps")
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def steps_per_second(events: Sequence[Mapping[str, Any]]) -> float | None:
    """Optimizer steps per second in the newest session with two snapshot events.

    A session runs from a start or resume event to the next; rates never span one, since a
    restart's downtime (and maybe another card) would be averaged in.
    """
    sessions: list[list[tuple[float, int]]] = [[]]
    for event in events:
        kind = event.get("event")
        if kind in ("start", "resume"):
            sessions.append([])
        elif kind == "snapshot":
            point = _point(event)
            if point is not None:
                sessions[-1].append(point)
    for session in reversed(sessions):
        if len(session) >= 2:
            (t0, s0), (t1, s1) = session[0], session[-1]
            if t1 > t0 and s1 > s0:
                return (s1 - s0) / (t1 - t0)
    return None


def _point(event: Mapping[str, Any]) -> tuple[float, int] | None:
    step, stamp = event.get("step"), event.get("time")
    if not isinstance(step, int) or not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp(), step
    except ValueError:
        return None


def steps_for_epochs(manifest: Mapping[str, Any], epochs: int) -> int | None:
    """Total optimizer steps of ``epochs`` epochs, from the snapshot's sampler and batch."""
    sampler = manifest.get("sampler") or {}
    samples, global_batch = sampler.get("num_samples"), (manifest.get("batch") or {}).get(
        "global")
    if not isinstance(samples, int) or not isinstance(global_batch, int) or global_batch < 1:
        return None
    if sampler.get("drop_last"):
        return epochs * (samples // global_batch)
    return epochs * -(-samples // global_batch)

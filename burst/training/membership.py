"""What a change of the run's membership cost: read from its history at a restore, and
recorded at the first optimizer step after it (``burst.contract.MembershipChange``).

Today every change is a restart from a persisted snapshot: a process (or a node, or the
whole job) ended, and a new one restores. Its goodput cost is the steps trained past the
restored snapshot that were thrown away, and the seconds from the loss to the first
optimizer step that trains again. The loss is the earliest sign of the end after the run
last (re)started: the failing rank's ``failure`` event (OOM, GPU failure, a signal), else
the agent's ``child-exit`` or the node's ``node-exit`` (a SIGKILL leaves nothing of its
own). The clock stops at the optimizer's step post-hook, so the restore, the rebuild of
the model and the first step's forward and backward all count.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from burst import events
from burst.contract import MEMBERSHIP_EVENT, MembershipChange, StateSource
from burst.store import Store
from burst.training.metrics import EVENT as METRICS_EVENT

UTC = timezone.utc
STARTS = ("start", "resume")  # a process began training
ENDS = ("failure", "child-exit", "node-exit")  # a process (or node) stopped training
FINE = ("ok",)  # a child-exit of these kinds is no loss


@dataclass(frozen=True)
class Loss:
    """What the history says about the end before this restore."""

    time: datetime | None  # the earliest sign of it; None: it left none
    cause: str | None
    reached: int | None  # the furthest step known completed before it
    world_size: int | None  # the world it trained in


def last_loss(history: Iterable[dict]) -> Loss:
    """The end the newest (re)start of the run came to, from its events (oldest first)."""
    since: list[dict] = []
    for event in history:
        if event.get("event") in STARTS:
            since = [event]
        elif since or event.get("event") in ENDS:
            since.append(event)
    ends = [e for e in since if e.get("event") in ENDS and e.get("kind") not in FINE]
    first = ends[0] if ends else None
    world = next((e.get("world_size") for e in [*ends, *since]
                  if isinstance(e.get("world_size"), int)), None)
    return Loss(time=_when(first), cause=None if first is None else _cause(first),
                reached=_reached(since), world_size=world)


def history(run_id: str, *stores: Store) -> list[dict]:
    """The run's events in ``stores`` (the local tier, the store), each once, oldest
    first; a store that cannot say is skipped, loudly (the history is worth less than the
    restore it measures)."""
    merged: dict[str, dict] = {}
    for store in {id(s): s for s in stores}.values():
        try:
            found = events.read(store, run_id)
        except Exception as exc:
            warnings.warn(f"burst: could not read the history of {run_id} in {store.url} to "
                          f"measure this restore: {exc}", RuntimeWarning, stacklevel=2)
            continue
        for event in found:
            merged.setdefault(json.dumps(event, sort_keys=True, default=str), event)
    return sorted(merged.values(), key=lambda e: datetime.fromisoformat(e["time"]))


def _cause(event: dict) -> str | None:
    kind = event.get("kind", event.get("decision"))
    return str(kind) if kind is not None else None


def _reached(events: list[dict]) -> int | None:
    """The furthest step completed: snapshots, logged metrics, a failure's step in
    progress (one past the last completed)."""
    steps: list[int] = []
    for event in events:
        name = event.get("event")
        if name in ("snapshot", *STARTS) and isinstance(event.get("step"), int):
            steps.append(event["step"])
        elif name == "failure" and isinstance(event.get("step"), int):
            steps.append(event["step"] - 1)
        elif name == METRICS_EVENT:
            steps += [p["step"] for p in event.get("points", []) if isinstance(p.get("step"), int)]
    return max(steps) if steps else None


def _when(event: dict | None) -> datetime | None:
    if event is None:
        return None
    return datetime.fromisoformat(event["time"])  # a valid time: events.read checked it


class FirstStep:
    """Records the ``membership-change`` of a restore at the first optimizer step after
    it (a one-shot step post-hook), once the restore is announced: a resume the run
    refused never enters the history, and neither does its cost."""

    def __init__(self, optimizer: torch.optim.Optimizer, loss: Loss, *, step: int,
                 world_after: int, world_saved: int | None, announced: Callable[[], bool],
                 record: Callable[..., None]) -> None:
        self._loss, self._step = loss, step
        self._worlds = (loss.world_size or world_saved, world_after)
        self._announced, self._record = announced, record
        self._handle = optimizer.register_step_post_hook(self._stepped)

    def _stepped(self, *_: Any) -> None:
        if not self._announced():
            return
        self._handle.remove()
        self._record(MEMBERSHIP_EVENT, **self.change(datetime.now(UTC)).to_event())

    def change(self, now: datetime) -> MembershipChange:
        loss = self._loss
        seconds = None if loss.time is None else max(0.0, (now - loss.time).total_seconds())
        lost = None if loss.reached is None else max(0, loss.reached - self._step)
        return MembershipChange(step=self._step, state_from=StateSource.STORE,
                                world_before=self._worlds[0], world_after=self._worlds[1],
                                steps_lost=lost,
                                seconds_to_step=None if seconds is None else round(seconds, 3),
                                cause=loss.cause)

    def cancel(self) -> None:
        self._handle.remove()

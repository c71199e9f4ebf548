"""Helpers for the deadline tests: a simulated clock and synthetic progress traces."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone

from burst import events
from burst.store import MemoryStore
from burst.store.base import Store
from tests.helpers import snapshot_helpers

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when the code under test sleeps (or a test advances it)."""

    def __init__(self, start: datetime = T0) -> None:
        self.moment = start
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self.moment

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.moment += timedelta(seconds=seconds)


def fresh_store() -> MemoryStore:
    return MemoryStore(uuid.uuid4().hex)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def trace(store: Store, run_id: str, points: Iterable[tuple[float, int]],
          start: float = 0.0) -> None:
    """A ``start`` event, then one ``snapshot`` event per (seconds after T0, step)."""
    events.append(store, run_id, "start", time=at(start).isoformat(), step=0)
    for seconds, step in points:
        events.append(store, run_id, "snapshot", time=at(seconds).isoformat(), step=step,
                      reason="periodic")


def steady(pace: float, until: float, every: float = 300.0, since: float = 0.0,
           step0: int = 0) -> list[tuple[float, int]]:
    """Snapshot points of a run going ``pace`` steps/s from ``since`` to ``until``."""
    points, moment = [], since
    while moment <= until:
        points.append((moment, step0 + round(pace * (moment - since))))
        moment += every
    return points


def piecewise(*pieces: tuple[float, float], every: float = 300.0) -> list[tuple[float, int]]:
    """Snapshots of a run whose pace changes: ((pace, until seconds), ...) from T0."""
    points: list[tuple[float, int]] = []
    since, step = 0.0, 0
    for pace, until in pieces:
        part = steady(pace, until, every, since, step)
        points += part if not points else part[1:]
        since, step = part[-1]
    return points


def take(store: Store, step: int, run_id: str = "run", total_steps: int | None = None) -> dict:
    """A real (tiny) snapshot in ``store`` with the counters and batch layout a plan reads."""
    return snapshot_helpers.take(
        store, step, run_id=run_id,
        counters={"step": step, "epoch": 0, "total_steps": total_steps},
        batch={"global": 8, "micro": 8, "accumulation": 1, "world_size": 1})


def recording() -> tuple[list[tuple[str, dict]], Callable[..., None]]:
    """An event recorder that keeps (name, fields) in a list."""
    seen: list[tuple[str, dict]] = []

    def record(name: str, /, **fields: object) -> None:
        seen.append((name, dict(fields)))

    return seen, record

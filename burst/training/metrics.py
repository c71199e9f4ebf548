"""Training metrics (loss, accuracy...) for reports, written cheaply in batches.

``Run.log(loss=...)`` is called every step, so it must cost next to nothing: points
are buffered in memory and written as one ``metrics`` event holding many points, when
a snapshot commits, when the buffer fills, and when the run closes. A crash loses at
most the points since the last snapshot, and those steps are replayed after the resume
anyway, so the report still shows a continuous curve.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

EVENT = "metrics"
MAX_BUFFERED = 200  # points per event; bounds memory and the size of one line


class MetricBuffer:
    """Collects ``{step, samples, time, name: value...}`` points; thread safe (a snapshot
    commit flushes from the persist thread while the loop keeps logging)."""

    EVENT = EVENT

    def __init__(self, write: Callable[[list[dict]], None]) -> None:
        self._write = write
        self._points: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, step: int, samples: int, values: dict[str, Any]) -> None:
        point = {"step": step, "samples": samples, "t": round(time.time(), 3),
                 **{name: _number(name, value) for name, value in values.items()}}
        with self._lock:
            self._points.append(point)
            full = len(self._points) >= MAX_BUFFERED
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            points, self._points = self._points, []
        if points:
            self._write(points)


def _number(name: str, value: Any) -> float | None:
    """A plain float (tensors and NumPy scalars included); NaN/inf become None for JSON."""
    if hasattr(value, "item"):
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"run.log({name}=...) needs a number, got {type(value).__name__}") from None
    return number if math.isfinite(number) else None

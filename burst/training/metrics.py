"""Training metrics (loss, accuracy...) for reports, written cheaply in batches.

``Run.log(loss=...)`` is called every step, so it must cost next to nothing: points
are buffered in memory and written as one ``metrics`` event holding many points, when
a snapshot commits, when the buffer fills, and when the run closes. A crash loses at
most the points since the last snapshot, and those steps are replayed after the resume
anyway, so the report still shows a continuous curve.

:class:`LiveFigures` is the live side of the same numbers: under ``burst run
--metrics-port`` the run publishes its latest step time, loss, batch layout and snapshot
figures for the agent's Prometheus exporter.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
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


FIGURES_ENV = "BURST_METRICS_DIR"  # set by ``burst run --metrics-port``: where to publish
FIGURES_FILE = "run.json"
PUBLISH_EVERY = 1.0  # seconds: a scrape wants fresh figures, not one write per step


class LiveFigures:
    """The run's latest figures, published for the supervising agent's Prometheus
    exporter (``burst.supervise.exporter``), which is another process.

    At most once a second, at a step boundary, the newest figures are written as one
    small JSON file, atomically (a temporary file then a rename), into the directory the
    agent names in ``$BURST_METRICS_DIR``: the loop pays one small write a second, the
    exporter reads the file only when it is scraped, and neither waits for the other.
    Without the variable every call returns at once."""

    def __init__(self, run_id: str, directory: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_id, self.clock = run_id, clock
        self.directory = directory if directory is not None else os.environ.get(FIGURES_ENV)
        self._published = -math.inf
        self._last_step: float | None = None
        self._figures: dict[str, Any] = {"run_id": run_id}

    @property
    def enabled(self) -> bool:
        return bool(self.directory)

    def logged(self, values: dict[str, Any]) -> None:
        """Values from ``run.log`` (the loss...), published with the next step."""
        if self.enabled:
            self._figures.update({f"logged_{k}": _number(k, v) for k, v in values.items()})

    def committed(self, manifest: dict) -> None:
        """A snapshot was persisted (called from the persist thread: plain assignments)."""
        if self.enabled:
            self._figures["snapshot_time"] = time.time()
            self._figures["snapshot_step"] = manifest.get("step")
            self._figures["snapshot_bytes"] = sum(
                int(blob.get("size", 0)) for blob in manifest.get("blobs", {}).values())

    def readiness(self, ready: Any) -> None:
        """The stager's newest readiness (:class:`burst.env.readiness.Readiness`, from its
        thread: plain assignments), published with the next step."""
        if self.enabled:
            self._figures.update(ready_bytes_pending=ready.pending_bytes,
                                 ready_objects_pending=ready.pending_objects,
                                 ready_upload_seconds=ready.upload_seconds,
                                 ready_setup_seconds=ready.setup_seconds,
                                 uplink_bytes_per_second=ready.uplink_bytes_per_second)

    def step_done(self, step: int, samples: int, micro_batch: int, accumulation: int,
                  uploading: bool | None, memory_reserved: int | None = None) -> None:
        """A step finished (``uploading`` None: no remote store, so no upload backlog;
        ``memory_reserved`` None: no CUDA)."""
        if not self.enabled:
            return
        now = self.clock()
        if self._last_step is not None and now > self._last_step:
            seconds = now - self._last_step
            self._figures.update(step_seconds=seconds, samples_per_second=samples / seconds)
        self._last_step = now
        self._figures.update(step=step, micro_batch=micro_batch, accumulation=accumulation)
        if memory_reserved is not None:
            self._figures["memory_reserved"] = memory_reserved
        if uploading is not None:  # the snapshot waiting or uploading: older ones are skipped
            self._figures["upload_backlog_bytes"] = (
                self._figures.get("snapshot_bytes", 0) if uploading else 0)
        if now - self._published >= PUBLISH_EVERY:
            self._published = now
            self.publish()

    def publish(self) -> None:
        """Write the figures now; a failed write costs the exporter one update, never the run."""
        if not self.directory:  # disabled: every call returns at once
            return
        figures = {**self._figures, "time": time.time()}
        path = os.path.join(self.directory, FIGURES_FILE)
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as out:
                json.dump(figures, out)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

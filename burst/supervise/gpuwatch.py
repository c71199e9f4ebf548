"""Watch the GPUs through NVML: memory, utilisation, temperature, ECC and Xid events.

Samples go to the run's events at an interval; a memory alert fires when usage stays
above a threshold (default 80%) for a sustained time (default five minutes), and records
the peak so the planner knows how close to the edge the run lives. Without NVML (no GPU,
no driver) the watch reports that once and does nothing else: supervising a CPU run is
still useful.

The alert rule is a small pure class (:class:`MemoryAlert`) fed with samples and a clock,
so it is tested with synthetic traces; :class:`GpuWatch` only reads NVML and feeds it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from burst.supervise.scale_policy import SCALE_POLICY_EVENT, ScaleMonitor

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


@dataclass
class GpuSample:
    index: int
    name: str
    memory_used: int
    memory_total: int
    utilization: int | None = None
    temperature: int | None = None
    ecc_uncorrected: int | None = None

    @property
    def memory_fraction(self) -> float:
        return self.memory_used / self.memory_total if self.memory_total else 0.0


@dataclass
class MemoryAlert:
    """Fires once per excursion when memory stays above ``threshold`` for ``sustain_s``."""

    threshold: float = 0.80
    sustain_s: float = 300.0
    above_since: float | None = None
    peak: int = 0
    fired: bool = False
    history: list[dict] = field(default_factory=list)

    def feed(self, sample: GpuSample, now: float) -> dict | None:
        """Return an alert record when this sample completes a sustained excursion."""
        if sample.memory_fraction < self.threshold:
            self.above_since, self.fired, self.peak = None, False, 0
            return None
        if self.above_since is None:
            self.above_since = now
        self.peak = max(self.peak, sample.memory_used)
        if self.fired or now - self.above_since < self.sustain_s:
            return None
        self.fired = True
        alert = {"gpu": sample.index, "threshold": self.threshold, "peak_bytes": self.peak,
                 "memory_total": sample.memory_total, "seconds_above": now - self.above_since}
        self.history.append(alert)
        return alert


class Nvml:
    """A thin reader over nvidia-ml-py; raises RuntimeError when NVML is unavailable."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise RuntimeError("nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML unavailable: {exc}") from exc
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                        for i in range(pynvml.nvmlDeviceGetCount())]
        self.events = self._register_xid()

    def _register_xid(self) -> Any:
        try:
            event_set = self.nvml.nvmlEventSetCreate()
            for handle in self.handles:
                self.nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL, event_set)
            return event_set
        except self.nvml.NVMLError:
            return None  # not supported on this device or driver

    def sample(self) -> list[GpuSample]:
        return [self._sample(i, h) for i, h in enumerate(self.handles)]

    def _sample(self, index: int, handle: Any) -> GpuSample:
        nvml = self.nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        return GpuSample(
            index=index, name=name.decode() if isinstance(name, bytes) else name,
            memory_used=int(memory.used), memory_total=int(memory.total),
            utilization=_optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            temperature=_optional(lambda: nvml.nvmlDeviceGetTemperature(handle, 0)),
            ecc_uncorrected=_optional(lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 1)),
        )

    def xid_events(self) -> list[dict]:
        """Xid errors that happened since the last call (does not block)."""
        found = []
        while self.events is not None:
            try:
                event = self.nvml.nvmlEventSetWait(self.events, 0)
            except self.nvml.NVMLError:
                break
            found.append({"xid": int(event.eventData), "event_type": int(event.eventType),
                          "gpu": _optional(functools.partial(self.nvml.nvmlDeviceGetIndex, event.device))})
        return found

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def _optional(read: Callable[[], Any]) -> Any:
    try:
        return int(read())
    except Exception:
        return None


class GpuWatch:
    """Samples every ``interval`` seconds on a thread and reports through ``record``."""

    def __init__(self, record: Callable[..., Any], interval: float = 30.0,
                 threshold: float = 0.80, sustain_s: float = 300.0,
                 reader: Callable[[], Nvml] = Nvml, scale: ScaleMonitor | None = None
                 ) -> None:
        self.record, self.interval = record, interval
        self.scale = scale  # --scale-out: decided at each reading (burst.supervise.scale_policy)
        self.threshold, self.sustain_s = threshold, sustain_s
        self.alerts: dict[int, MemoryAlert] = {}  # one per GPU: excursions are per card
        self.reader_factory = reader
        self.peak_bytes: dict[int, int] = {}
        self.latest: list[GpuSample] = []  # the newest reading (the metrics exporter's)
        self.xid_counts: dict[int | None, int] = {}  # per GPU index (None: not known)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = False

    def start(self) -> bool:
        if self.scale is not None:  # parsed and in force, with or without NVML to feed it
            self.record(SCALE_POLICY_EVENT, **self.scale.policy.as_dict(),
                        nodes=self.scale.nodes)
        try:
            self._nvml = self.reader_factory()
        except RuntimeError as exc:
            self.record("gpu-watch", available=False, reason=str(exc))
            return False
        self.available = True
        self._thread = threading.Thread(target=self._loop, name="burst-gpuwatch", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll(time.monotonic())
            self._stop.wait(self.interval)

    def poll(self, now: float) -> None:
        samples = self._nvml.sample()
        for sample in samples:
            self.peak_bytes[sample.index] = max(self.peak_bytes.get(sample.index, 0),
                                                sample.memory_used)
            rule = self.alerts.setdefault(sample.index,
                                          MemoryAlert(self.threshold, self.sustain_s))
            alert = rule.feed(sample, now)
            if alert:
                self.record("memory-alert", **alert)
        self.latest = samples
        if self.scale is not None:
            self.scale.feed([s.memory_fraction for s in samples], now)
        self.record("gpu-sample", gpus=[asdict(s) for s in samples])
        for xid in self._nvml.xid_events():
            self.xid_counts[xid.get("gpu")] = self.xid_counts.get(xid.get("gpu"), 0) + 1
            self.record("xid", **xid)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.available:
            self._nvml.close()

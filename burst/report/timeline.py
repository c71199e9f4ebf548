"""A run's history, read back from its events and snapshots into series a report draws.

Everything here is pure data: times are seconds since the run's first event, so charts
of runs that crossed machines and days stay readable, and tests need no plotting.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from burst import events
from burst.contract import MEMBERSHIP_EVENT, MembershipChange
from burst.snapshot import reader
from burst.store.base import Store
from burst.training.metrics import EVENT as METRICS_EVENT

GIB = 1024**3
MARKED = ("start", "resume", "snapshot", "failure", "policy", "child-start", "child-exit",
          "launch", "memory-alert", "finish", MEMBERSHIP_EVENT)


@dataclass
class Marker:
    """A moment worth a line on every chart: a snapshot, a failure, a resume..."""

    t: float
    kind: str
    label: str
    event: dict = field(repr=False, default_factory=dict)


@dataclass
class Timeline:
    run_id: str
    started: str | None = None
    loss: list[tuple[float, int, float]] = field(default_factory=list)  # (t, step, value)
    throughput: list[tuple[float, float]] = field(default_factory=list)  # (t, samples/s)
    memory: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)
    threshold: float = 0.8  # (t, used GiB, total GiB) per GPU above
    markers: list[Marker] = field(default_factory=list)
    places: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    final_step: int | None = None
    membership: list[MembershipChange] = field(default_factory=list)  # what each change cost

    def count(self, kind: str) -> int:
        return sum(1 for m in self.markers if m.kind == kind)


def load(store: Store, run_id: str, *more: Store, threshold: float = 0.8) -> Timeline:
    """Read events from ``store`` (and, deduplicated, from ``more``: the agent writes its
    history to the local tier when the snapshots go to a remote store)."""
    history = _merged([events.read(s, run_id) for s in (store, *more)])
    timeline = Timeline(run_id, threshold=threshold)
    if not history:
        return timeline
    origin = _seconds(history[0]["time"])
    timeline.started = history[0]["time"]
    for event in history:
        _add(timeline, event, _seconds(event["time"]) - origin, origin)
    timeline.throughput = _throughput(timeline, history, origin)
    timeline.snapshots = _snapshots(store, run_id)
    return timeline


def _merged(sources: list[list[dict]]) -> list[dict]:
    seen, out = set(), []
    for event in (e for source in sources for e in source):
        key = (event.get("time"), event.get("event"), event.get("step"), event.get("attempt"))
        if "time" in event and key not in seen:
            seen.add(key)
            out.append(event)
    return sorted(out, key=lambda e: _seconds(e["time"]))


def _add(timeline: Timeline, event: dict, t: float, origin: float) -> None:
    name = event.get("event", "")
    if name == METRICS_EVENT:
        for point in event.get("points", []):
            if point.get("loss") is not None:
                timeline.loss.append((point["t"] - origin, point["step"], point["loss"]))
    elif name == "gpu-sample":
        for gpu in event.get("gpus", []):
            series = timeline.memory.setdefault(int(gpu.get("index", 0)), [])
            series.append((t, gpu.get("memory_used", 0) / GIB, gpu.get("memory_total", 0) / GIB))
    if name == "memory-alert" and "threshold" in event:
        timeline.threshold = float(event["threshold"])
    if name == "finish":
        timeline.final_step = event.get("step")
    if name == MEMBERSHIP_EVENT and (change := MembershipChange.from_event(event)) is not None:
        timeline.membership.append(change)
    if name in ("start", "resume", "launch"):
        timeline.places.append({"t": t, "how": name, **_place(event)})
    if name in MARKED:
        timeline.markers.append(Marker(t, name, _label(event), event))


def _place(event: dict) -> dict[str, Any]:
    """Where a segment of the run ran: whatever the event says about the machine."""
    keys = ("step", "card", "host", "node", "target", "launcher", "cloud", "infra", "region",
            "accelerators", "gpu", "micro", "accumulation", "global", "world_size")
    return {k: event[k] for k in keys if event.get(k) is not None}


def _label(event: dict) -> str:
    name = event.get("event", "")
    if name == "snapshot":
        return f"snapshot step {event.get('step')} ({event.get('reason')})"
    if name == "failure":
        return f"{event.get('kind')} in step {event.get('step')}"
    if name == "resume":
        return f"resumed at step {event.get('step')} (micro-batch {event.get('micro')})"
    if name == "policy":
        return f"policy: {event.get('action')} after {event.get('kind')}"
    if name == "child-exit":
        return f"attempt {event.get('attempt')} exited: {event.get('kind')}"
    if name == MEMBERSHIP_EVENT:
        return (f"back at step {event.get('step')} from the {event.get('state_from')}: "
                f"{event.get('steps_lost')} step(s) lost, training again after "
                f"{event.get('seconds_to_step')}s")
    if name == "memory-alert":
        return f"memory above {event.get('threshold', 0):.0%} on GPU {event.get('gpu')}"
    return name


def _throughput(timeline: Timeline, history: list[dict], origin: float
                ) -> list[tuple[float, float]]:
    """Samples per second between consecutive metric points of the same process; the
    gap across a failure and restart is not training time, so it is skipped."""
    breaks = sorted(_seconds(e["time"]) - origin for e in history
                    if e.get("event") in ("start", "resume", "failure"))
    points = sorted(((p["t"] - origin, p["samples"]) for e in history
                     if e.get("event") == METRICS_EVENT for p in e.get("points", [])
                     if "samples" in p), key=lambda p: p[0])
    out = []
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        crossed = any(t0 < b <= t1 for b in breaks)
        if t1 > t0 and s1 > s0 and not crossed:
            out.append((t1, (s1 - s0) / (t1 - t0)))
    return out


def _snapshots(store: Store, run_id: str) -> list[dict[str, Any]]:
    out = []
    for step in reader.list_steps(store, run_id):
        manifest = reader.read_manifest(store, run_id, step) or {}
        batch = manifest.get("batch", {})
        out.append({"step": step, "reason": manifest.get("reason"), "time": manifest.get("time"),
                    "card": manifest.get("card"), "micro": batch.get("micro"),
                    "accumulation": batch.get("accumulation")})
    return out


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()

"""What ``burst status --watch`` shows: a run's pulse, read from its store and local tier.

Step, samples per second and loss come from the run's ``metrics`` events (the points
``Run.log`` buffers and writes at each snapshot), memory from the GPU watch's newest
``gpu-sample`` (else the newest snapshot's measured peak), where it runs from the history,
and the snapshot's age and the upload backlog as ``burst status`` finds them. Nothing asks
the training process, so a run on a node shows the same way as a local one: from what its
node uploaded. Each call reads afresh; the caller decides how often.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from burst.errors import SnapshotError
from burst.resume.status import last_failure, merged_events, pending_uploads, where
from burst.snapshot import reader
from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10
RATE_POINTS = 20  # samples/s over the newest this many metric points of the session
POINT_KEYS = ("step", "samples", "t")  # a point's bookkeeping; the rest are the metrics
BRIEF_KEYS = ("step", "kind", "reason", "to", "where", "returncode", "error", "message",
              "state", "action")


def live_view(store: Store, run_id: str, local: Store | None = None,
              now: datetime | None = None, last: int = 6) -> dict[str, Any]:
    """The run's pulse as plain values (``--json`` and every renderer print exactly this)."""
    now = now or datetime.now(UTC)
    history = merged_events(store, run_id, local)
    remote_steps = reader.list_steps(store, run_id)
    local_steps = reader.list_steps(local, run_id) if local is not None else []
    if not remote_steps and not local_steps and not history:
        raise SnapshotError(f"run {run_id!r} has nothing in {store.url}")
    newest = _newest(store, local, run_id, remote_steps, local_steps)
    points = session_points(history)
    metrics = {k: v for k, v in (points[-1] if points else {}).items() if k not in POINT_KEYS}
    return {
        "run": run_id, "store": store.url, "time": now.isoformat(timespec="seconds"),
        "where": where(history),
        "step": _step(points, newest, history),
        "samples_per_second": samples_per_second(points),
        "loss": metrics.get("loss"),
        "metrics": metrics,
        "snapshot": _snapshot(newest, now, remote_steps),
        "upload_backlog": pending_uploads(store, run_id, remote_steps, local_steps),
        "memory": memory(history, newest),
        "last_failure": last_failure(history),
        "events": [brief(e) for e in history[-last:]] if last > 0 else [],
    }


def _newest(store: Store, local: Store | None, run_id: str, remote_steps: list[int],
            local_steps: list[int]) -> dict | None:
    if local is not None and local_steps and (not remote_steps or
                                              local_steps[-1] > remote_steps[-1]):
        return reader.read_manifest(local, run_id)
    return reader.read_manifest(store, run_id) if remote_steps else None


def session_points(history: list[dict]) -> list[dict]:
    """The metric points logged since the newest start or resume, oldest first."""
    points: list[dict] = []
    for event in history:
        if event.get("event") in ("start", "resume"):
            points = []
        elif event.get("event") == "metrics" and isinstance(event.get("points"), list):
            points += [p for p in event["points"] if isinstance(p, dict)]
    return points


def samples_per_second(points: list[dict]) -> float | None:
    """Samples consumed per second over the newest ``RATE_POINTS`` points of a session."""
    recent = [p for p in points[-RATE_POINTS:]
              if isinstance(p.get("samples"), int | float) and isinstance(p.get("t"), int | float)]
    if len(recent) < 2:
        return None
    first, newest = recent[0], recent[-1]
    seconds = newest["t"] - first["t"]
    if seconds <= 0 or newest["samples"] < first["samples"]:
        return None
    return (newest["samples"] - first["samples"]) / seconds


def _step(points: list[dict], manifest: dict | None, history: list[dict]) -> int | None:
    seen = [p["step"] for p in points[-1:] if isinstance(p.get("step"), int)]
    if manifest is not None and isinstance(manifest.get("step"), int):
        seen.append(manifest["step"])
    seen += [e["step"] for e in history[-20:]
             if e.get("event") in ("snapshot", "finish") and isinstance(e.get("step"), int)]
    return max(seen) if seen else None


def _snapshot(manifest: dict | None, now: datetime, remote_steps: list[int]
              ) -> dict[str, Any] | None:
    if manifest is None:
        return None
    age = None
    if isinstance(manifest.get("time"), str):
        try:
            age = max((now - datetime.fromisoformat(manifest["time"])).total_seconds(), 0.0)
        except (ValueError, TypeError):
            age = None
    return {"step": manifest.get("step"), "age_seconds": age, "reason": manifest.get("reason"),
            "in_store": manifest.get("step") in remote_steps}


def memory(history: list[dict], manifest: dict | None) -> dict[str, Any] | None:
    """GPU memory in use from the newest ``gpu-sample`` (all GPUs summed), else the newest
    snapshot's measured peak; None on a run that measured neither (a CPU run)."""
    for event in reversed(history):
        gpus = event.get("gpus") if event.get("event") == "gpu-sample" else None
        if isinstance(gpus, list) and gpus:
            used = sum(int(g.get("memory_used", 0)) for g in gpus if isinstance(g, dict))
            total = sum(int(g.get("memory_total", 0)) for g in gpus if isinstance(g, dict))
            return {"source": "gpu-sample", "used_bytes": used, "total_bytes": total,
                    "gpus": len(gpus), "time": event.get("time")}
    peaks = ((manifest or {}).get("memory") or {}).get("peak_bytes_by_micro_batch") or {}
    values = [v for v in peaks.values() if isinstance(v, int)]
    if values:
        return {"source": "snapshot", "peak_bytes": max(values),
                "card": (manifest or {}).get("card")}
    return None


def brief(event: dict) -> dict[str, Any]:
    """An event as its time, name and a few telling fields (never its bulky payloads)."""
    fields = {k: event[k] for k in BRIEF_KEYS if event.get(k) not in (None, "")}
    if event.get("event") == "metrics" and isinstance(event.get("points"), list):
        fields["points"] = len(event["points"])
    return {"time": event.get("time"), "event": event.get("event"), **fields}

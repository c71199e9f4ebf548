"""``burst status``: where a run is and how it is doing, read from its store alone.

Everything comes from what the run left behind (snapshots, upload markers and the event
history), never from asking a process, so it works from any machine that can read the
store: the laptop the run crashed on, or a colleague's. The local tier is read too when
it is here: it holds snapshots not uploaded yet and the newest events of a local run.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from burst import events
from burst.errors import BurstError, SnapshotError
from burst.snapshot import reader as snapshot
from burst.store import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

PLACE_EVENTS = ("launch", "launch-end", "node-start", "node-exit", "child-start",
                "child-exit", "start", "resume", "finish", "preempted")
FAILURE_EVENTS = ("failure", "preempted", "capacity")


def run_status(store: Store, run_id: str, local: Store | None = None,
               now: datetime | None = None) -> dict[str, Any]:
    """The run's status as plain values (``--json`` prints exactly this)."""
    history = merged_events(store, run_id, local)
    remote_steps = snapshot.list_steps(store, run_id)
    local_steps = snapshot.list_steps(local, run_id) if local is not None else []
    if not remote_steps and not local_steps and not history:
        raise SnapshotError(f"run {run_id!r} has nothing in {store.url}")
    newest = snapshot.read_manifest(store, run_id) if remote_steps else None
    if local_steps and (not remote_steps or local_steps[-1] > remote_steps[-1]):
        newest = snapshot.read_manifest(local, run_id)  # type: ignore[arg-type]
    return {
        "run": run_id, "store": store.url,
        "where": where(history),
        "snapshot": _snapshot(newest, now or datetime.now(UTC), bool(remote_steps) and
                              newest is not None and newest["step"] in remote_steps),
        "pending_uploads": pending_uploads(store, run_id, remote_steps, local_steps),
        "last_failure": last_failure(history),
        "plan": plan_in_force(history, newest),
        "events": len(history),
    }


def merged_events(store: Store, run_id: str, local: Store | None) -> list[dict]:
    """Events of the store and the local tier, each once, oldest first."""
    seen: dict[tuple, dict] = {}
    sources: Iterable[Store] = (store,) if local is None else (store, local)
    for source in sources:
        try:
            found = events.read(source, run_id)
        except BurstError:
            continue
        for event in found:
            seen.setdefault((event.get("time"), event.get("event"), event.get("source")), event)
    return sorted(seen.values(), key=lambda e: str(e.get("time")))


def where(history: list[dict]) -> dict[str, Any]:
    """The newest event that says where the run is, turned into a place and a state."""
    for event in reversed(history):
        name = event.get("event")
        if name not in PLACE_EVENTS:
            continue
        if name == "launch":
            return {"place": event.get("to"), "state": "launching or running",
                    "detail": event.get("name"), "since": event.get("time")}
        if name == "node-start":
            return {"place": _node_place(event), "state": "training",
                    "detail": event.get("task_id") or event.get("node_dir"),
                    "since": event.get("time")}
        if name == "node-exit":
            return {"place": _node_place(event), "state": _ended(event.get("returncode")),
                    "detail": event.get("message"), "since": event.get("time")}
        if name == "launch-end":
            return {"place": event.get("where"), "state": _ended(event.get("returncode")),
                    "detail": None, "since": event.get("time")}
        if name == "preempted":
            return {"place": event.get("where"), "state": "preempted, recovering",
                    "detail": None, "since": event.get("time")}
        if name == "child-exit":
            return {"place": "local", "state": _ended(event.get("returncode")),
                    "detail": event.get("kind"), "since": event.get("time")}
        if name == "finish":
            return {"place": "local", "state": "finished", "detail": None,
                    "since": event.get("time")}
        return {"place": "local", "state": "training", "detail": None,
                "since": event.get("time")}
    return {"place": "unknown", "state": "no history", "detail": None, "since": None}


def _node_place(event: dict) -> str:
    return f"node {event.get('host', '?')}" + (f" ({event['node_dir']})"
                                               if event.get("node_dir") else "")


def _ended(code: Any) -> str:
    return "finished" if code == 0 else f"stopped (exit {code})"


def _snapshot(manifest: dict | None, now: datetime, uploaded: bool) -> dict[str, Any] | None:
    if manifest is None:
        return None
    taken = manifest.get("time")
    age = None
    if isinstance(taken, str):
        try:
            age = max((now - datetime.fromisoformat(taken)).total_seconds(), 0.0)
        except ValueError:
            age = None
    return {"step": manifest["step"], "epoch": (manifest.get("counters") or {}).get("epoch"),
            "time": taken, "age_seconds": age, "reason": manifest.get("reason"),
            "in_store": uploaded}


def pending_uploads(store: Store, run_id: str, remote_steps: list[int],
                    local_steps: list[int]) -> list[int]:
    """Local snapshots newer than the store's newest, and uploads still marked in flight."""
    newest = remote_steps[-1] if remote_steps else -1
    pending = {s for s in local_steps if s > newest}
    for key in store.list(f"{run_id}/uploads/"):
        stem = key.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            pending.add(int(stem))
    return sorted(pending)


def last_failure(history: list[dict]) -> dict[str, Any] | None:
    for index in range(len(history) - 1, -1, -1):
        event, name = history[index], history[index].get("event")
        if name == "child-exit" and event.get("kind") not in (None, "ok"):
            # the agent saw the exit; the process itself said more just before, if it could
            event = _own_report(history[:index], event.get("kind")) or event
            name = event.get("event")
        if name in FAILURE_EVENTS or (name == "child-exit" and event.get("kind") not in
                                      (None, "ok")):
            kind = event.get("kind") or name
            reason = (event.get("error") or event.get("message") or event.get("signal")
                      or event.get("candidate") or event.get("where"))
            return {"kind": kind, "step": event.get("step"), "reason": reason,
                    "time": event.get("time")}
    return None


def _own_report(earlier: list[dict], kind: str) -> dict | None:
    """The training process's own ``failure`` event for the attempt that just exited."""
    for event in reversed(earlier):
        if event.get("event") == "child-start":
            return None
        if event.get("event") == "failure" and event.get("kind") == kind:
            return event
    return None


def plan_in_force(history: list[dict], manifest: dict | None) -> dict[str, Any] | None:
    """What the node planned when it started, else the newest snapshot's layout."""
    for event in reversed(history):
        if event.get("event") == "node-start" and isinstance(event.get("plan"), dict):
            return {"source": "node", **event["plan"]}
    if manifest is None:
        return None
    batch = manifest.get("batch") or {}
    return {"source": "snapshot", "card": manifest.get("card"),
            "global_batch": batch.get("global"), "micro_batch": batch.get("micro"),
            "accumulation": batch.get("accumulation"), "world_size": batch.get("world_size"),
            "amp": (manifest.get("amp") or {}).get("dtype")}

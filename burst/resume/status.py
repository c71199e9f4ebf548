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
from burst.contract import Exit, Reason
from burst.env import readiness
from burst.errors import BurstError, SnapshotError
from burst.snapshot import reader
from burst.store import Store
from burst.training.adaptive import FIRST_PERSIST_SECONDS

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

PLACE_EVENTS = ("launch", "launch-end", "node-start", "node-exit", "restart-limit",
                "child-start", "child-exit", "start", "resume", "finish", "preempted")
FAILURE_EVENTS = ("failure", "preempted", "capacity", "restart-limit")
# What a job's exit means, most telling first (as burst.supervise.verdict ranks records):
# a GPU failure says the machine is bad, an OOM that the card is too small, a script error
# that the code is wrong, a signal stop only that something stopped it.
CODE_RANK = {Exit.GPU_FAILURE: 4, Exit.OOM: 3, Exit.STOPPED: 1, 0: 0}
OTHER_FAILURE_RANK = 2


def run_status(store: Store, run_id: str, local: Store | None = None,
               now: datetime | None = None) -> dict[str, Any]:
    """The run's status as plain values (``--json`` prints exactly this)."""
    history = merged_events(store, run_id, local)
    remote_steps = reader.list_steps(store, run_id)
    local_steps = reader.list_steps(local, run_id) if local is not None else []
    if not remote_steps and not local_steps and not history:
        raise SnapshotError(f"run {run_id!r} has nothing in {store.url}")
    newest = reader.read_manifest(store, run_id) if remote_steps else None
    if local is not None and local_steps and (not remote_steps or local_steps[-1] > remote_steps[-1]):
        newest = reader.read_manifest(local, run_id)
    return {
        "run": run_id, "store": store.url,
        "where": where(history),
        "snapshot": _snapshot(newest, now or datetime.now(UTC), bool(remote_steps) and
                              newest is not None and newest["step"] in remote_steps),
        "pending_uploads": pending_uploads(store, run_id, remote_steps, local_steps),
        "last_failure": last_failure(history),
        "plan": plan_in_force(history, newest),
        "intervals": snapshot_intervals(history, newest),
        "job": detached_job(history),
        "readiness": published_readiness(store, run_id, local),
        "events": len(history),
    }


def published_readiness(store: Store, run_id: str, local: Store | None
                        ) -> dict[str, Any] | None:
    """The newest readiness the run's stager published (:mod:`burst.env.readiness`),
    with its sentence; None when no stager ran (a run from before staging, another rank)."""
    for source in (s for s in (local, store) if s is not None):
        found = readiness.load(source, run_id)
        if found is not None:
            return {**found.as_dict(), "line": found.line()}
    return None


def detached_job(history: list[dict]) -> dict[str, Any] | None:
    """The newest job started detached on an SSH box (``ssh-job``), with whether a
    ``launch-end`` has been recorded for it since: one still running can be attached to."""
    for index in range(len(history) - 1, -1, -1):
        event = history[index]
        if event.get("event") != "ssh-job":
            continue
        if not (event.get("target") and event.get("dir") and event.get("pid")):
            return None  # recorded before burst said where to reattach
        ended = next((e for e in history[index + 1:] if e.get("event") == "launch-end"), None)
        return {"target": event["target"], "dir": event["dir"], "pid": int(event["pid"]),
                "where": event.get("where"), "since": event.get("time"),
                "returncode": ended.get("returncode") if ended else None,
                "ended": ended is not None}
    return None


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
    """The newest event that says where the run is, turned into a place and a state.

    A training process's own events (``start``, ``resume``, ``child-exit``, ``finish``)
    cannot tell where the process runs; on a node they follow its ``node-start``, whose
    place they take (:func:`_process_place`)."""
    for index in range(len(history) - 1, -1, -1):
        event = history[index]
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
        if name == "restart-limit":
            return {"place": _node_place(event), "state": f"stopped: {event.get('restarts')} "
                    f"restarts, over the bound of {event.get('bound')}",
                    "detail": event.get("task_id"), "since": event.get("time")}
        if name == "launch-end":
            return {"place": event.get("where"), "state": _ended(event.get("returncode")),
                    "detail": None, "since": event.get("time")}
        if name == "preempted":
            return {"place": event.get("where"), "state": "preempted, recovering",
                    "detail": None, "since": event.get("time")}
        place = _process_place(history[:index])
        if name == "child-exit":
            return {"place": place, "state": _ended(event.get("returncode")),
                    "detail": event.get("kind"), "since": event.get("time")}
        if name == "finish":
            return {"place": place, "state": "finished", "detail": None,
                    "since": event.get("time")}
        return {"place": place, "state": "training", "detail": None,
                "since": event.get("time")}
    return {"place": "unknown", "state": "no history", "detail": None, "since": None}


def _process_place(earlier: list[dict]) -> str:
    """Where a training process's event happened: the node whose ``node-start`` came
    before it (with no end of that node or launch between), else this machine."""
    for event in reversed(earlier):
        name = event.get("event")
        if name in ("node-exit", "launch-end", "restart-limit"):
            return "local"
        if name == "node-start":
            return _node_place(event)
    return "local"


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
        except (ValueError, TypeError):  # TypeError: a time without a zone
            age = None
    return {"step": manifest["step"], "epoch": (manifest.get("counters") or {}).get("epoch"),
            "time": taken, "age_seconds": age, "reason": manifest.get("reason"),
            "in_store": uploaded}


def snapshot_intervals(history: list[dict], manifest: dict | None) -> dict[str, Any] | None:
    """The shadow and persist intervals in force and the work a SIGKILL would lose: the
    newest snapshot's record of them, or a newer ``snapshot-intervals`` event (what the
    run chose from its measured costs, ``burst.training.adaptive``)."""
    chosen = next((e for e in reversed(history) if e.get("event") == "snapshot-intervals"),
                  None)
    saved = (manifest or {}).get("intervals")
    newer_event = chosen is not None and (not isinstance(saved, dict) or manifest is None
                                          or chosen.get("step", -1) > manifest["step"])
    found = chosen if newer_event else saved
    if not isinstance(found, dict):
        return None
    keys = ("shadow_every", "persist_seconds", "expected_loss_seconds", "step_seconds",
            "shadow_cost", "persist_cost", "budget", "chosen")
    intervals = {key: found.get(key) for key in keys}
    # chosen intervals persist first after FIRST_PERSIST_SECONDS of training: a run that
    # never got there has only what close() (or a failure) wrote
    intervals["first_persist_pending"] = bool(found.get("chosen")) and not any(
        e.get("event") == "snapshot" and e.get("reason") == Reason.PERIODIC for e in history)
    return intervals


def intervals_line(intervals: dict[str, Any]) -> str:
    """One line for ``burst status``: the intervals and the expected loss on a kill."""
    if intervals.get("first_persist_pending"):
        return (f"shadow every {intervals.get('shadow_every')} step(s); no periodic persist "
                f"yet: the first comes after {FIRST_PERSIST_SECONDS:.0f}s of training, so a "
                "run shorter than that persists only at close() (a kill before then loses "
                "it all; persist_every=N persists by steps)")
    persist = intervals.get("persist_seconds")
    loss = intervals.get("expected_loss_seconds")
    head = (f"shadow every {intervals.get('shadow_every')} step(s), persist "
            + (f"every {persist:.0f}s" if isinstance(persist, int | float) else "by steps only"))
    tail = f"; a kill loses ~{loss:.0f}s of training" if isinstance(loss, int | float) else ""
    budget = intervals.get("budget")
    how = (f" (chosen for a {budget:.0%} overhead budget)"
           if intervals.get("chosen") and isinstance(budget, int | float) else " (set by the run)")
    return head + how + tail


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


def _own_report(earlier: list[dict], kind: object) -> dict | None:
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


# -- what a job's end means ----------------------------------------------------------------


def decisive_code(codes: Iterable[object]) -> int | None:
    """The code that says most about how a set of nodes ended (see ``CODE_RANK``); what
    is not an exit code (a missing one, read from an event) is skipped."""
    ranked = [c for c in codes if isinstance(c, int)]
    if not ranked:
        return None
    return max(ranked, key=lambda c: CODE_RANK.get(c, OTHER_FAILURE_RANK))


def now() -> str:
    """The current time as events write it (to compare with their ``time``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def job_ended_with(store: Store, run_id: str, since: str, fallback: int) -> int:
    """:func:`job_exit_code` from the run's history in ``store``; ``fallback`` (the
    launcher's status) when no node of the job said, or the history cannot be read."""
    code = job_exit_code(merged_events(store, run_id, None), since)
    return fallback if code is None else code


def job_exit_code(history: list[dict], since: str | None = None) -> int | None:
    """How the job launched at ``since`` (an event time) ended, in burst's own codes: 0,
    86, 87, 88, from its nodes' own events; None when no node of it said.

    A launcher's status does not carry this (``sky.jobs.tail_logs`` returns 0 or 100).
    The job's last attempt is the one that began with its newest ``node-start`` (or a
    ``restart-limit``, a start that refused to train); its nodes' exits decide, the most
    telling one winning (on several nodes, one node's OOM stops the others' training with
    a signal). A start refused over the restart bound means the failure that kept coming
    back (the event's ``code``)."""
    recent = [e for e in history if since is None or str(e.get("time")) >= since]
    begun = [str(e.get("time")) for e in recent
             if e.get("event") in ("node-start", "restart-limit")]
    if not begun:
        return None
    last = max(begun)
    codes = []
    for event in recent:
        if str(event.get("time")) < last:
            continue
        if event.get("event") == "node-exit":
            codes.append(event.get("returncode"))
        elif event.get("event") == "restart-limit":
            codes.append(event.get("code"))
    return decisive_code(codes)

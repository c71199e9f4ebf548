"""A run's history: one JSON line per event in ``<run-id>/events.jsonl`` in its store.

Starts, resumes, snapshots, failures and launches all land here, so ``burst status``
and the planner can read what happened without asking the process that did it.
Local files are appended to in one write (the agent and the training process share
the file); object stores cannot append, so there it is a read-modify-write under a lock; losing an event to a crash is acceptable, losing a snapshot is not, which is why
snapshots never depend on this file.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

_LOCK = threading.Lock()


def key(run_id: str) -> str:
    return f"{run_id}/events.jsonl"


def append(store: Store, run_id: str, event_name: str, /, **fields: Any) -> dict:
    event = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
             "event": event_name, **fields}
    line = json.dumps(event, sort_keys=True, default=str) + "\n"
    if hasattr(store, "append"):  # a local file: a true append, safe across processes
        store.append(key(run_id), line.encode())
        return event
    with _LOCK:
        try:
            existing = store.get(key(run_id))
        except KeyError:
            existing = b""
        store.put(key(run_id), existing + line.encode())
    return event


def record(store: Store, run_id: str, event_name: str, /, *,
           say: Callable[[str], None] | None = None, **fields: Any) -> dict | None:
    """Append an event without ever failing the caller; return it, or None if it was lost.

    The one error policy for every writer of a run's history: the history is worth less
    than the training, launch or backup that records it, so a store that refuses the
    write is reported (through ``say``, else as a warning) and the caller carries on.
    """
    try:
        return append(store, run_id, event_name, **fields)
    except Exception as exc:
        message = f"could not record {event_name!r} event: {exc}"
        if say is None:
            warnings.warn(f"burst: {message}", stacklevel=2)
        else:
            say(message)
        return None


def merge(src: Store, dst: Store, run_id: str) -> bool:
    """Make ``dst``'s history hold every event of both stores; True if it changed.

    Several machines write a run's history (the laptop, the agent, a cloud node after a
    resume), each into its own local copy, so copying one file over another would lose
    the other side's events. The union is ordered by time; events of the same
    millisecond keep the order their writer gave them. Lines that are not events are
    dropped (with a warning), never spread to another store.
    """
    ours, theirs = _events(src, run_id), _events(dst, run_id)
    known = {line for line, _ in theirs}
    new = [(line, event) for line, event in ours if line not in known]
    if not new:
        return False
    merged = sorted(theirs + new, key=lambda pair: str(pair[1].get("time", "")))  # stable
    dst.put(key(run_id), "".join(line + "\n" for line, _ in merged).encode())
    return True


def read(store: Store, run_id: str) -> list[dict]:
    """Every event of the run, oldest first; lines that are not events are skipped."""
    return [event for _, event in _events(store, run_id)]


def _events(store: Store, run_id: str) -> list[tuple[str, dict]]:
    """Each line of the history that holds an event, with the event.

    The file is anyone's to damage (a crash mid-line, a hostile store: one line nested
    50,000 deep), and every reader of a run (status, report, pull, the agent) goes
    through here, so a bad line costs a warning, one per file, never the command.
    """
    try:
        data = store.get(key(run_id)).decode(errors="replace")
    except KeyError:
        return []
    out, bad = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        event = _parse(line)
        if event is None:
            bad += 1
        else:
            out.append((line, event))
    if bad:
        warnings.warn(f"burst: skipped {bad} line(s) of {key(run_id)} in {store.url} that are "
                      "not events", RuntimeWarning, stacklevel=3)
    return out


def _parse(line: str) -> dict | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to be an event
        return None
    return event if isinstance(event, dict) else None

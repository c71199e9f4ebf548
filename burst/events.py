"""A run's history: JSON lines of events (failures, launches, resumes, node exits) in its store.

Starts, resumes, snapshots, failures and launches all land here, so ``burst status``
and the planner can read what happened without asking the process that did it.

Where the lines live depends on what the store can do:

- a store that appends (a local directory: the local tier, a ``file://`` store) keeps one
  file, ``<run-id>/events.jsonl``, appended to in one ``O_APPEND`` write, so the agent and
  the training process share it safely;
- an object store cannot append, and several writers reach it at once (the nodes of one
  job finishing together, the resume that launched them, the laptop's uploads). A
  read-modify-write of one shared object there loses whichever write lands first: the
  decisive ``node-exit`` of one node could vanish. So each writing process keeps its own
  object, ``<run-id>/history/<writer>.jsonl``, which nobody else writes: its
  read-modify-write races no one.

A reader takes the union of ``events.jsonl`` and every history object, each line once,
ordered by time (lines of the same millisecond keep their written order). Losing an event
to a crash is acceptable, losing a snapshot is not, which is why snapshots never depend on
the history.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import socket
import threading
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

_LOCK = threading.Lock()
_WRITER: dict[int, str] = {}  # pid -> this process's writer name (a fork gets its own)


def key(run_id: str) -> str:
    """The shared history file (appended to where the store appends)."""
    return f"{run_id}/events.jsonl"


def history_prefix(run_id: str) -> str:
    return f"{run_id}/history/"


def writer_key(run_id: str, writer: str) -> str:
    """The history object only ``writer`` ever writes."""
    return f"{history_prefix(run_id)}{writer}.jsonl"


def process_writer() -> str:
    """This process's writer name: host, pid and a random part (a reused pid, or the
    same pid on another host, never names the same object)."""
    pid = os.getpid()
    if pid not in _WRITER:
        host = socket.gethostname().split(".")[0] or "host"
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)[:32]
        _WRITER[pid] = f"{safe}-{pid}-{secrets.token_hex(4)}"
    return _WRITER[pid]


def exists(store: Store, run_id: str) -> bool:
    """Whether the run has any history in ``store``."""
    return store.size(key(run_id)) is not None or bool(store.list(history_prefix(run_id)))


def append(store: Store, run_id: str, event_name: str, /, **fields: Any) -> dict:
    event = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
             "event": event_name, **fields}
    line = json.dumps(event, sort_keys=True, default=str) + "\n"
    if hasattr(store, "append"):  # a local file: a true append, safe across processes
        store.append(key(run_id), line.encode())
        return event
    _extend_own(store, writer_key(run_id, process_writer()), line.encode())
    return event


def _extend_own(store: Store, own: str, data: bytes) -> None:
    """Add ``data`` to an object only this process writes (the lock: its threads)."""
    with _LOCK:
        try:
            existing = store.get(own)
        except KeyError:
            existing = b""
        store.put(own, existing + data)


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
    the other side's events. Only the events ``dst`` lacks are written: appended where
    ``dst`` appends, else added to this process's own history object there. Lines that
    are not events are dropped (with a warning), never spread to another store.
    """
    known = {line for line, _ in _events(dst, run_id)}
    new = [line for line, _ in _events(src, run_id) if line not in known]
    if not new:
        return False
    data = "".join(line + "\n" for line in new).encode()
    if hasattr(dst, "append"):
        dst.append(key(run_id), data)
    else:
        _extend_own(dst, writer_key(run_id, _merge_writer(src)), data)
    return True


def _merge_writer(src: Store) -> str:
    """The object a merge from ``src`` writes: this process's, named for ``src`` too."""
    tag = hashlib.sha256(src.url.encode()).hexdigest()[:8]
    return f"{process_writer()}-{tag}"


def read(store: Store, run_id: str) -> list[dict]:
    """Every event of the run, oldest first; lines that are not events are skipped."""
    return [event for _, event in _events(store, run_id)]


def _events(store: Store, run_id: str) -> list[tuple[str, dict]]:
    """Each line of the history that holds an event, with the event, each line once,
    ordered by time (stable: a writer's lines of one millisecond keep their order).

    The history is anyone's to damage (a crash mid-line, a hostile store: one line nested
    50,000 deep), and every reader of a run (status, report, pull, the agent) goes
    through here, so a bad line costs a warning, one per read, never the command.
    """
    out: list[tuple[str, dict]] = []
    seen: set[str] = set()
    bad = 0
    for name in [key(run_id), *sorted(store.list(history_prefix(run_id)))]:
        try:
            data = store.get(name).decode(errors="replace")
        except KeyError:
            continue
        for line in data.splitlines():
            if not line.strip() or line in seen:
                continue
            event = _parse(line)
            if event is None:
                bad += 1
                continue
            seen.add(line)
            out.append((line, event))
    if bad:
        warnings.warn(f"burst: skipped {bad} line(s) of the history of {run_id} in {store.url} "
                      "that are not events", RuntimeWarning, stacklevel=3)
    return sorted(out, key=lambda pair: str(pair[1].get("time", "")))


def _parse(line: str) -> dict | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to be an event
        return None
    return event if isinstance(event, dict) and _typed(event) else None


# The largest magnitude a number in an event may have: beyond it a float loses whole
# seconds and bytes, and an int past a float's range fails every reader's arithmetic.
_MAX_NUMBER = 2**63


def _typed(event: dict) -> bool:
    """Whether every field a reader computes with has the type it computes with.

    Readers (status, report, the planner, the agent) do arithmetic on times, steps,
    metric points and GPU samples, so a line with a string, list, null, bool or
    overflowing number in one of those places is not an event: checked once here, where
    every history is read, instead of guarded in each reader. Fields nobody computes
    with are left as they are (they are only shown)."""
    if not isinstance(event.get("event"), str) or not _is_time(event.get("time")):
        return False
    if not all(_is_int(event.get(name)) for name in _COUNTS if event.get(name) is not None):
        return False
    if "threshold" in event and not _is_number(event["threshold"]):
        return False
    points, gpus = event.get("points", []), event.get("gpus", [])
    return (isinstance(points, list) and all(_is_point(p) for p in points)
            and isinstance(gpus, list) and all(_is_gpu(g) for g in gpus))


_COUNTS = ("step", "attempt", "gpu", "pid")  # whole numbers where present (null: not known)


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError, OSError):
        return False
    return True


def _is_int(value: object) -> bool:
    return type(value) is int and abs(value) < _MAX_NUMBER


def _is_number(value: object, *, minimum: float = -_MAX_NUMBER) -> bool:
    if type(value) is int:
        return minimum <= value < _MAX_NUMBER
    return type(value) is float and math.isfinite(value) and minimum <= value < _MAX_NUMBER


def _is_point(point: object) -> bool:
    """One metrics point: a time (seconds since the epoch), a step, numbers logged."""
    return (isinstance(point, dict) and _is_number(point.get("t"), minimum=0)
            and _is_int(point.get("step"))
            and all(_is_number(point[k]) for k in ("loss", "samples")
                    if point.get(k) is not None))


def _is_gpu(gpu: object) -> bool:
    """One GPU of a sample: its index and memory figures in bytes."""
    return (isinstance(gpu, dict) and _is_int(gpu.get("index", 0))
            and all(_is_number(gpu.get(k, 0), minimum=0)
                    for k in ("memory_used", "memory_total")))

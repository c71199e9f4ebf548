"""Named kill points: SIGKILL this process at the Nth point reached, for crash-matrix tests.

The commit protocol (blobs, then the manifest; manifests deleted before blobs) only
proves itself under real crashes at every step of it, so the code that writes snapshots
marks each step with ``hit("name")``. Normally nothing is armed and ``hit`` returns after
two global reads. Armed (``BURST_KILLPOINT=N`` in the environment, or :func:`arm` in a
forked test child), the Nth point reached SIGKILLs the whole process: no ``finally``,
no atexit, no flush, exactly like the OOM killer or a preempted VM. The environment is
read at the first point reached, not at import (nothing runs at import time); an
:func:`arm` before that wins over it.

``BURST_KILLPOINT=NAME#K+J`` counts one point's hits instead: after the Kth hit of ``NAME``,
the Jth point the same thread reaches next kills (``+J`` left out: the Kth hit itself). Other
threads' points (a background upload's, an event's) then cannot shift where a kill lands, which
a plain count of every point, taken on one run and replayed on the next, cannot promise.

``BURST_KILLPOINT_LOG=path`` appends each point's name as it is reached (one line, written
before any kill), so a harness can count the points of a workload and say where it killed.
"""

from __future__ import annotations

import os
import signal
import threading

ENV_KILLPOINT = "BURST_KILLPOINT"
ENV_LOG = "BURST_KILLPOINT_LOG"

_lock = threading.Lock()
_target: int | None = None
_log: str | None = None
_count = 0
_named: tuple[str, int, int] | None = None  # (NAME, K, J) of a NAME#K+J kill point
_named_hits = 0  # how often NAME was reached so far
_follow: tuple[int, int] | None = None  # (thread, points left) once NAME's Kth hit came
_configured = False  # set by the first arm(), from the environment or by hand


def arm(target: int | None, log: str | None = None) -> None:
    """Kill at the ``target``-th point from now (None: never); log point names to ``log``."""
    global _target, _named, _named_hits, _follow, _log, _count, _configured
    with _lock:
        _target, _log, _count, _configured = target, log, 0, True
        _named, _named_hits, _follow = None, 0, None


def _from_env() -> None:
    """Arm from ``BURST_KILLPOINT`` / ``BURST_KILLPOINT_LOG``, once, unless arm() ran."""
    global _target, _named, _log, _count, _configured
    raw = os.environ.get(ENV_KILLPOINT, "").strip()
    with _lock:
        if not _configured:  # set last: a thread that sees it sees the rest
            _target = int(raw) if raw.isdigit() and int(raw) > 0 else None
            _named = None if raw.isdigit() else _parse_named(raw)
            _log, _count = os.environ.get(ENV_LOG) or None, 0
            _configured = True


def _parse_named(raw: str) -> tuple[str, int, int] | None:
    """``NAME#K`` or ``NAME#K+J`` as (NAME, K, J); anything else arms nothing."""
    name, _, where = raw.partition("#")
    nth, _, then = where.partition("+")
    if not name or not nth.isdigit() or int(nth) < 1 or (then and not then.isdigit()):
        return None
    return name, int(nth), int(then or 0)


def hit(name: str) -> None:
    """Mark a point of a persist or upload; free unless a kill point or log is armed."""
    if not _configured:
        _from_env()
    if _target is None and _named is None and _log is None:
        return
    global _count
    with _lock:
        _count += 1
        if _named is not None:
            _count_named(name)
        if _log is not None:
            fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{_count} {name}\n".encode())
            finally:
                os.close(fd)
        if _count == _target or _follow == (threading.get_ident(), 0):
            os.kill(os.getpid(), signal.SIGKILL)


def _count_named(name: str) -> None:
    """Advance a ``NAME#K+J`` kill point by one point reached (under the lock)."""
    global _named_hits, _follow
    assert _named is not None
    wanted, nth, then = _named
    me = threading.get_ident()
    if _follow is not None and _follow[0] == me:
        _follow = (me, _follow[1] - 1)
    elif _follow is None and name == wanted:
        _named_hits += 1
        if _named_hits == nth:
            _follow = (me, then)

"""Is a snapshot on the wire right now, and how fast does this machine's uplink go?

Two figures the pre-staging of a run (:mod:`burst.env.stager`) steers by. Snapshots go
first: while one uploads, staging pauses, so the newest training state never queues
behind a wheel. And readiness ("N MB still to upload, about T s") needs the uplink's
speed, which the snapshot uploads measure for free: each finished push records the bytes
it sent and the seconds it took. Both are process-wide (the upload queue runs in a
thread of the training process, the stager in another) and cost a lock, never I/O.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator

# a push that sent less than this measures latency, not bandwidth: not counted
MIN_MEASURED_BYTES = 1 << 20
KEEP = 8  # the uplink is the mean of the newest this many measured pushes

_LOCK = threading.Lock()
_ACTIVE = [0]  # snapshot uploads in flight in this process
_SAMPLES: deque[tuple[int, float]] = deque(maxlen=KEEP)  # (bytes sent, seconds)


@contextlib.contextmanager
def sending() -> Iterator[None]:
    """Mark a snapshot upload in flight for the duration of the block."""
    with _LOCK:
        _ACTIVE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1


def busy() -> bool:
    """Whether a snapshot is being uploaded now (a lock and a counter: call it often)."""
    with _LOCK:
        return _ACTIVE[0] > 0


def record(bytes_sent: int, seconds: float) -> None:
    """One finished push: ``bytes_sent`` new bytes in ``seconds`` (small ones ignored)."""
    if bytes_sent >= MIN_MEASURED_BYTES and seconds > 0:
        with _LOCK:
            _SAMPLES.append((bytes_sent, seconds))


def uplink() -> float | None:
    """Bytes per second the newest snapshot pushes reached; None before one measured."""
    with _LOCK:
        samples = list(_SAMPLES)
    if not samples:
        return None
    return sum(b for b, _ in samples) / sum(s for _, s in samples)


def reset() -> None:
    """Forget every measurement (tests)."""
    with _LOCK:
        _SAMPLES.clear()
        _ACTIVE[0] = 0

"""The uplink share pre-staging may use: a token bucket that waits while snapshots upload.

Python cannot lower one thread's network priority (``os.nice`` is per process, and a
training process's snapshots must never be the ones slowed), so the stager's thread
limits itself: before sending ``n`` bytes it takes ``n`` tokens from a bucket that refills
at the configured rate, and it takes none while a snapshot is on the wire
(:func:`burst.snapshot.traffic.busy`). Snapshots go first; staging gets what is left.

The rate comes from ``$BURST_STAGE_RATE``: a number of bytes per second with an optional
unit (``4MB``, ``30Mbit``), or a share of the measured uplink (``50%``, the default). Until
an upload has measured the uplink, a share means :data:`UNMEASURED_RATE`.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable

from burst.errors import ConfigError
from burst.snapshot import traffic

RATE_ENV = "BURST_STAGE_RATE"
DEFAULT_RATE = "50%"
UNMEASURED_RATE = 4e6  # bytes/s a share means before any snapshot measured the uplink
BURST_SECONDS = 1.0  # the bucket holds at most this many seconds of tokens
CHUNK = 1 << 20  # tokens are taken in chunks this big, so a stop is seen within one
PAUSE_POLL = 0.05  # seconds between looks at a snapshot upload in flight
MIN_NAP = 0.001  # never a shorter wait: rounding must not spin the loop
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1 << 20,
          "gib": 1 << 30, "kbit": 125, "mbit": 125e3, "gbit": 125e6}
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(%|[a-z]*)\s*(?:/s)?\s*", re.IGNORECASE)


def parse_rate(text: str) -> tuple[float | None, float | None]:
    """``"50%"`` -> (None, 0.5); ``"30Mbit"`` -> (3.75e6, None): a fixed rate or a share."""
    match = _RATE.fullmatch(text or "")
    unit = match.group(2).lower() if match else ""
    if not match or (unit != "%" and unit not in _UNITS):
        raise ConfigError(f"${RATE_ENV} must be bytes per second (4MB, 30Mbit) or a share "
                          f"of the uplink (50%), got {text!r}")
    value = float(match.group(1))
    if unit == "%":
        if not 0 < value <= 100:
            raise ConfigError(f"${RATE_ENV} share must be in (0, 100]%, got {text!r}")
        return None, value / 100
    if value <= 0:
        raise ConfigError(f"${RATE_ENV} must be positive, got {text!r}")
    return value * _UNITS[unit], None


class TokenBucket:
    """A :class:`burst.staging.parts.Throttle`: ``rate()`` bytes/s, none while ``paused()``.

    ``rate`` is asked at each refill, so a share follows the uplink as it is measured;
    ``clock`` and ``sleep`` are injectable so the arithmetic is tested without waiting."""

    def __init__(self, rate: Callable[[], float], *, paused: Callable[[], bool] = traffic.busy,
                 stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.rate, self.paused, self.clock = rate, paused, clock
        self.stop = stop or threading.Event()
        self.sleep = sleep or self.stop.wait  # a stop wakes a sleeping stager at once
        self._tokens = 0.0
        self._last = clock()
        self.waited = 0.0  # seconds spent waiting (tests, the stager's record)
        self.paused_seconds = 0.0

    def wait(self, nbytes: int) -> None:
        """Block until ``nbytes`` may be sent; returns early (having taken what it could)
        once ``stop`` is set: the caller checks ``stop`` before sending."""
        left = nbytes
        while left > 0 and not self.stop.is_set():
            take = min(left, CHUNK)
            self._take(take)
            left -= take

    def _take(self, nbytes: int) -> None:
        while not self.stop.is_set():
            if self.paused():
                self._nap(PAUSE_POLL, paused=True)
                self._last = self.clock()  # no tokens accrue while snapshots have the link
                continue
            rate = max(self.rate(), 1.0)
            now = self.clock()
            self._tokens = min(self._tokens + (now - self._last) * rate,
                               max(rate * BURST_SECONDS, nbytes))
            self._last = now
            if self._tokens >= nbytes:
                self._tokens -= nbytes
                return
            self._nap(max((nbytes - self._tokens) / rate, MIN_NAP))

    def _nap(self, seconds: float, paused: bool = False) -> None:
        self.waited += seconds
        if paused:
            self.paused_seconds += seconds
        self.sleep(seconds)


def configured(environ: dict[str, str] | None = None) -> Callable[[], float]:
    """The rate ``$BURST_STAGE_RATE`` asks for, as a function of the measured uplink."""
    text = (os.environ if environ is None else environ).get(RATE_ENV) or DEFAULT_RATE
    fixed, share = parse_rate(text)
    if fixed is not None:
        return lambda: fixed
    assert share is not None
    return lambda: share * (traffic.uplink() or UNMEASURED_RATE / share)

"""Retries with exponential backoff and full jitter, for failures a retry can fix.

Only :class:`~burst.store.base.TransientStoreError` (throttling, 5xx, resets, timeouts) is
retried; wrong credentials or a missing bucket fail at once, since waiting cannot fix them.
Full jitter (a uniform draw up to the capped exponential delay) keeps many uploaders that
were throttled together from coming back together. The draw comes from the operating
system (``random.SystemRandom``), never from Python's global generator: an upload thread
retrying must not move the random stream the training loop draws from (a snapshot holds
that stream, and a resumed run would replay it shifted).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from burst.store.base import TransientStoreError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base: float = 0.5  # seconds before the first retry, at most
    cap: float = 30.0  # no single wait is longer than this

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``attempt`` (1-based): uniform in [0, min(cap, base*2^n)]."""
        ceiling = min(self.cap, self.base * (2 ** (attempt - 1)))
        return (rng or random.SystemRandom()).uniform(0, ceiling)


DEFAULT_RETRY = RetryPolicy()


def retry(fn: Callable[[], T], policy: RetryPolicy = DEFAULT_RETRY,
          sleep: Callable[[float], None] = time.sleep,
          deadline: float | None = None) -> T:
    """Call ``fn`` until it succeeds, retrying transient store errors per ``policy``.

    ``deadline`` (a ``time.monotonic()`` value) stops retrying once a wait would pass it.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except TransientStoreError:
            if attempt == policy.attempts:
                raise
            wait = policy.delay(attempt)
            if deadline is not None and time.monotonic() + wait > deadline:
                raise
            sleep(wait)
    raise AssertionError("unreachable")

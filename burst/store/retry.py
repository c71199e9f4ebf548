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

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from burst.store.base import Pace, Store, TransientStoreError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Thunk(Protocol[T_co]):
    """A call with no arguments: ``Callable[[], T]``, spelled so that the type checker also
    takes a lambda whose defaults bind a loop's variables (``lambda k=key: store.get(k)``)."""

    def __call__(self) -> T_co: ...


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


def retry(fn: Thunk[T], policy: RetryPolicy = DEFAULT_RETRY,
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


class Retrying:
    """``store`` with each idempotent call (``get``, ``size``, ``list``, ``put``,
    ``put_file``, ``put_if_absent``, ``delete``) made through :func:`retry`; anything else is the
    store's own.

    For code that talks to a store in many small steps, each of which a transient fault
    can hit: the wheelhouse's index, lockfile and wheels, read and written one by one. A
    ``put_if_absent`` whose first try landed but lost its answer says False on the retry
    (already there), which is what content-addressed objects need."""

    def __init__(self, store: Store, policy: RetryPolicy = DEFAULT_RETRY) -> None:
        self.store, self.policy, self.url = store, policy, store.url

    def get(self, key: str) -> bytes:
        return retry(lambda: self.store.get(key), self.policy)

    def size(self, key: str) -> int | None:
        return retry(lambda: self.store.size(key), self.policy)

    def list(self, prefix: str) -> list[str]:
        return retry(lambda: self.store.list(prefix), self.policy)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        retry(lambda: self.store.put(key, data), self.policy)

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Each try continues what the last one sent, where the store can (S3 parts)."""
        retry(lambda: self.store.put_file(key, path, pace), self.policy)

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        return retry(lambda: self.store.put_if_absent(key, data), self.policy)

    def delete(self, key: str) -> None:
        retry(lambda: self.store.delete(key), self.policy)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def retrying(store: Store, policy: RetryPolicy = DEFAULT_RETRY) -> Store:
    """``store`` behind :class:`Retrying` (once: a store already behind one is kept)."""
    return store if isinstance(store, Retrying) else Retrying(store, policy)

"""The background upload queue between the local snapshot tier and a remote store.

The snapshot persister calls :meth:`UploadQueue.submit` when a snapshot is committed
locally; that only records the step and wakes a thread, so the training loop never waits
on the network. One snapshot uploads at a time. When uploads fall behind, the newest
committed snapshot wins: a step still waiting when a newer one arrives is skipped rather
than uploaded stale (the one already uploading finishes, since its blobs are mostly shared
with the next). Transient failures are retried with backoff and jitter
(:mod:`burst.store.retry`); a snapshot that still fails is reported by :meth:`flush`, and the next
submit tries again. A restarted process calls :meth:`catch_up`, and the push it starts
skips every blob that already landed, so nothing verified is sent twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from burst.errors import BurstError, StoreError
from burst.snapshot import traffic
from burst.snapshot.reader import list_steps
from burst.snapshot.retention import sweep_temporaries
from burst.snapshot.sync import Transfer, copy_extras, push_snapshot
from burst.store.base import Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy


class UploadQueue:
    """Uploads ``run_id``'s snapshots from ``local`` to ``remote`` on one background thread."""

    def __init__(self, local: Store, remote: Store, run_id: str, *,
                 policy: RetryPolicy = DEFAULT_RETRY,
                 on_uploaded: Callable[[Transfer], None] | None = None) -> None:
        self.local, self.remote, self.run_id = local, remote, run_id
        self.policy, self.on_uploaded = policy, on_uploaded
        self._cond = threading.Condition()
        self._pending: int | None = None
        self._active: int | None = None
        self._thread: threading.Thread | None = None
        self._error: BurstError | None = None
        self.uploaded: list[Transfer] = []
        # seconds from submit (the local commit) to stored, of the newest upload: how stale
        # the store's newest snapshot can be (the spot persist interval is sized by it)
        self.last_seconds: float | None = None
        self._submitted = 0.0
        self.skipped: list[int] = []

    def submit(self, step: int) -> None:
        """Queue ``step`` for upload, superseding any older step still waiting. Never blocks."""
        with self._cond:
            if self._pending is not None:
                if self._pending >= step:
                    return
                self.skipped.append(self._pending)
            self._pending, self._submitted = step, time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="burst-upload",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def catch_up(self) -> None:
        """After a restart: queue the newest local snapshot (a no-op push if it is there),
        and clear the stale temporaries a killed write left in either store."""
        for store in (self.local, self.remote):
            with contextlib.suppress(BurstError, OSError):  # housekeeping never stops uploads
                sweep_temporaries(store, self.run_id)
        steps = list_steps(self.local, self.run_id)
        if steps:
            self.submit(steps[-1])

    def busy(self) -> bool:
        with self._cond:
            return self._pending is not None or self._active is not None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted is uploaded (or ``timeout`` seconds pass).

        Raises ``StoreError`` if the deadline passes (uploading goes on in the background)
        or if the newest upload failed after its retries.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._active is not None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    step = self._active if self._active is not None else self._pending
                    raise StoreError(f"upload of {self.run_id}@{step} to {self.remote.url} did "
                                     f"not finish within {timeout:.0f}s; it goes on in the "
                                     "background")
                self._cond.wait(remaining)
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _work(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                step, self._pending, self._active = self._pending, None, self._pending
                submitted = self._submitted
            try:
                with traffic.sending():  # pre-staging pauses meanwhile (burst.env.stager)
                    transfer = push_snapshot(self.local, self.remote, self.run_id, step,
                                             policy=self.policy)
                    copy_extras(self.local, self.remote, self.run_id, self.policy)
                traffic.record(transfer.bytes_sent, transfer.seconds)
            except BurstError as exc:
                failure: BurstError | None = exc
            except Exception as exc:  # a bug or an SDK surprise: report it, keep the thread
                failure = StoreError(f"uploading {self.run_id}@{step} failed: {exc!r}")
            else:
                failure = None
                self.last_seconds = time.monotonic() - submitted
                self.uploaded.append(transfer)
                if self.on_uploaded:
                    with contextlib.suppress(Exception):  # a hook must not stop uploads
                        self.on_uploaded(transfer)
            with self._cond:
                self._active = None
                if failure is not None:
                    self._error = failure
                elif self._pending is None:
                    self._error = None  # the newest snapshot is safe: older failures moot
                self._cond.notify_all()

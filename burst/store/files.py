"""Large local files into a store: several at once, each from disk, none sent twice.

What a node needs besides the snapshot (the wheelhouse's 3-4 GB of CUDA wheels, the run's
inputs) is files on this machine under content-addressed keys. :func:`upload_files` sends
the ones the store lacks, a few at a time (each through the store's
:meth:`~burst.store.base.Store.put_file`: parallel multipart parts on S3 and OSS, read
from disk, never whole in memory) and is resumable at two levels: a file whose key already
holds an object of its size is skipped (its key names its content, and every write is
atomic, so the right size is the right object), and on S3 an upload a failed or killed try
left open is continued part by part.

A background stager (:mod:`burst.staging.parts`) passes its throttle's ``wait`` as ``pace``
and its stop event as ``stop``: once ``stop`` is set no new file starts and every upload in
flight stops before its next part, keeping what landed for the next call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from burst.errors import StoreError
from burst.store.base import Pace, Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retrying

# Files sent at once. Each S3 file also sends its parts in parallel (the store's pool), so
# a few files keep the uplink full; more would only split it across more partial files.
FILE_WORKERS = 4


class Stopped(StoreError):
    """An upload was stopped (its ``stop`` event set) before it finished."""


@dataclass
class FilesSent:
    """What one :func:`upload_files` did: files sent, and files the store already had."""

    sent: int = 0
    bytes_sent: int = 0
    present: int = 0
    bytes_present: int = 0
    stopped: bool = False  # ``stop`` was set: some files are still missing

    def count(self, size: int, sent: bool) -> None:
        with _LOCK:
            if sent:
                self.sent, self.bytes_sent = self.sent + 1, self.bytes_sent + size
            else:
                self.present, self.bytes_present = self.present + 1, self.bytes_present + size


_LOCK = threading.Lock()


def upload_files(store: Store, files: Sequence[tuple[str, Path]], *,
                 workers: int = FILE_WORKERS, pace: Pace | None = None,
                 stop: threading.Event | None = None,
                 policy: RetryPolicy = DEFAULT_RETRY) -> FilesSent:
    """Put each ``(key, path)`` the store lacks (no object of the file's size under
    ``key``), ``workers`` files at a time, each retried on a transient fault through
    ``policy`` (a retry continues the file's upload). Returns early, with ``stopped`` set, once ``stop`` is
    set; raises the first other failure after the files in flight have finished."""
    store = retrying(store, policy)
    done = FilesSent()
    paced = _paced(pace, stop)

    def one(key: str, path: Path) -> None:
        if stop is not None and stop.is_set():
            raise Stopped("stopped")
        size = path.stat().st_size
        if store.size(key) == size:
            done.count(size, sent=False)
            return
        store.put_file(key, path, paced)
        done.count(size, sent=True)

    if not files:
        return done
    with ThreadPoolExecutor(min(workers, len(files)), thread_name_prefix="burst-files") as pool:
        futures = [pool.submit(one, key, path) for key, path in files]
        errors = [f.exception() for f in futures]
    failure = next((e for e in errors if e is not None and not isinstance(e, Stopped)), None)
    if failure is not None:
        raise failure
    done.stopped = any(isinstance(e, Stopped) for e in errors)
    return done


def _paced(pace: Pace | None, stop: threading.Event | None) -> Pace | None:
    """``pace`` that first raises :class:`Stopped` once ``stop`` is set."""
    if stop is None:
        return pace

    def paced(nbytes: int) -> None:
        if stop.is_set():
            raise Stopped("stopped")
        if pace is not None:
            pace(nbytes)

    return paced

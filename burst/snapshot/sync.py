"""Moving snapshots between stores: ``push`` (local tier → remote) and ``pull`` (back).

Both commit through :mod:`burst.snapshot.commit`, the protocol every writer shares: an
upload marker, every blob (verified), the manifest last, a repair pass for blobs a racing
GC removed, so a snapshot is complete in the destination or not there at all. A push
never replaces a step the remote already has (first writer wins); a pull puts the copy it
was asked for in place. A blob the destination already holds (same content-addressed
name, same size) is not sent again: that is what makes a frozen-backbone fine-tune upload
only what changed, and a killed upload resume without re-sending what it had finished.

Push hash-checks each blob before it leaves, so a corrupt local copy is never published.
Pull fetches each blob straight into a temporary file, checks its hash, and renames it
into place; a missing or corrupt blob fails that snapshot and pull falls back to the
newest older complete one, saying so. From a store that reads in parts (S3, OSS:
:class:`PartReader`) a blob comes down as parallel ranged GETs and each part is hashed as
soon as it has landed, while the later ones are still on the wire, so verifying costs
little more than the download itself; a cut-off part is fetched again on its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from burst import events
from burst.errors import LinkOutOfStoreError, SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot.commit import OnBlob, commit
from burst.snapshot.reader import list_steps, read_manifest_bytes
from burst.store import LocalStore, Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry

Progress = Callable[[int, int], None]  # (bytes just done, bytes in this snapshot)
Log = Callable[[str], None]
# run files besides snapshots (the lockfile, the code archive) copied whole
EXTRA_DIRS = ("env/", "code/")  # the history (events.jsonl) is merged, not copied


@dataclass
class Transfer:
    """What one push or pull moved, for progress lines, ``--json`` and tests."""

    run_id: str
    step: int
    total_bytes: int = 0
    blobs_sent: int = 0
    bytes_sent: int = 0
    blobs_skipped: int = 0
    bytes_skipped: int = 0
    manifest: str = "written"  # or "present": the store already had this snapshot
    seconds: float = 0.0
    fallbacks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def count(self, size: int, sent: bool) -> None:
        """Record one blob, from any worker thread."""
        with _COUNT_LOCK:
            if sent:
                self.blobs_sent += 1
                self.bytes_sent += size
            else:
                self.blobs_skipped += 1
                self.bytes_skipped += size


_COUNT_LOCK = threading.Lock()


# -- push -------------------------------------------------------------------------------


def push(src: Store, dst: Store, run_id: str, step: int | None = None, *, every: bool = False,
         progress: Progress | None = None, policy: RetryPolicy = DEFAULT_RETRY
         ) -> list[Transfer]:
    """Push the newest snapshot (or ``step``, or with ``every`` all of them) to ``dst``."""
    steps = list_steps(src, run_id)
    if not steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {src.url}")
    if step is not None and step not in steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step} in {src.url}")
    chosen = steps if every else [step if step is not None else steps[-1]]
    overall = _one_bar(progress, src, run_id, chosen)
    transfers = [push_snapshot(src, dst, run_id, s, progress=overall, policy=policy)
                 for s in chosen]
    copy_extras(src, dst, run_id, policy)
    return transfers


def _one_bar(progress: Progress | None, src: Store, run_id: str, steps: list[int]
             ) -> Progress | None:
    """One bar for several snapshots: each reports its own total, the bar shows their sum
    (shared blobs count in every snapshot that has them: sent once, then found there)."""
    if progress is None or len(steps) < 2:
        return progress
    grand = sum(sum(_sizes(read_manifest_bytes(src, run_id, s)[1]).values()) for s in steps)
    return lambda n, _total: progress(n, grand)


def push_snapshot(src: Store, dst: Store, run_id: str, step: int, *,
                  progress: Progress | None = None, policy: RetryPolicy = DEFAULT_RETRY
                  ) -> Transfer:
    """Commit one snapshot of ``src`` into ``dst``, unless ``dst`` already has that step."""
    started = time.monotonic()
    raw, manifest = read_manifest_bytes(src, run_id, step)
    blobs = _sizes(manifest)
    transfer = Transfer(run_id, step, total_bytes=sum(blobs.values()))
    if not commit(dst, run_id, step, raw, blobs,
                  lambda digest, size: send_blob(src, dst, run_id, digest, size, policy,
                                                 algo=fmt.hash_of(manifest)),
                  overwrite=False, points="push", policy=policy,
                  on_blob=_counter(transfer, progress)):
        transfer.manifest = "present"  # there before us, or another writer won: keep theirs
    done = transfer.bytes_sent + transfer.bytes_skipped
    if done < transfer.total_bytes:  # present from the start: nothing was counted
        _tick(progress, transfer.total_bytes - done, transfer.total_bytes)
    transfer.seconds = time.monotonic() - started
    return transfer


def send_blob(src: Store, dst: Store, run_id: str, digest: str, size: int,
              policy: RetryPolicy = DEFAULT_RETRY, *, algo: str) -> None:
    """Copy one blob, refusing to send bytes that do not match their name (hashed by
    ``algo``, its manifest's :func:`~burst.snapshot.format.hash_of`)."""
    key = fmt.blob_key(run_id, digest)
    with source_view(src, key, size) as view:
        def check() -> None:
            if fmt.digest(view, algo) != digest:
                raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is corrupt in "
                                    f"{src.url}: not uploading it")

        if isinstance(dst, CheckedPut):  # hashed while it is sent, visible only if it matches
            retry(lambda: dst.put_checked(key, view, check), policy)
            return
        check()
        retry(lambda: dst.put(key, view), policy)


@runtime_checkable
class CheckedPut(Protocol):
    """A store that can check an object's bytes while writing them and refuse to make
    it visible if the check fails (:meth:`burst.store.s3.S3Store.put_checked`)."""

    def put_checked(self, key: str, data: memoryview, check: Callable[[], None]) -> None: ...


@contextlib.contextmanager
def source_view(store: Store, key: str, size: int) -> Iterator[memoryview]:
    """A blob's bytes: memory-mapped from a local store, else read into memory."""
    if isinstance(store, LocalStore):
        try:
            with store.view(key) as view:
                if len(view) != size:
                    raise SnapshotError(f"{key} is {len(view)} bytes in {store.url}, "
                                        f"the manifest says {size}")
                yield view
            return
        except KeyError:
            raise SnapshotError(f"{key} is missing from {store.url}") from None
    buffer = memoryview(bytearray(size))
    try:
        actual = store.read_into(key, buffer)
    except KeyError:
        raise SnapshotError(f"{key} is missing from {store.url}") from None
    if actual != size:
        raise SnapshotError(f"{key} is {actual} bytes in {store.url}, the manifest says {size}")
    yield buffer


def copy_extras(src: Store, dst: Store, run_id: str,
                policy: RetryPolicy = DEFAULT_RETRY) -> int:
    """Copy the run's other files (lockfile, code archive, events) that ``dst`` lacks or
    holds in another version (the side that is copying from has the newer one).

    Every call goes through the retry policy, reads as much as writes: a truncated GET of
    a lockfile must not fail a pull whose snapshot already landed."""
    copied = int(retry(lambda: events.merge(src, dst, run_id), policy))
    for directory in EXTRA_DIRS:
        for key in retry(lambda d=directory: src.list(f"{run_id}/{d}"), policy):
            size = retry(lambda k=key: src.size(k), policy)
            if size is not None and retry(lambda k=key: dst.size(k), policy) != size:
                try:
                    data = retry(lambda k=key: src.get(k), policy)
                except KeyError:
                    continue  # removed since the listing: nothing to copy
                retry(lambda k=key, d=data: dst.put(k, d), policy)
                copied += 1
    return copied


# -- pull -------------------------------------------------------------------------------


def pull(src: Store, dst: Store, run_id: str, step: int | None = None, *,
         progress: Progress | None = None, log: Log | None = None,
         policy: RetryPolicy = DEFAULT_RETRY, kept: Kept | None = None) -> Transfer:
    """Pull the newest complete snapshot (at or before ``step``) that verifies.

    A snapshot with a missing or corrupt blob is skipped for the next older one; each
    fallback is reported through ``log`` and recorded in ``Transfer.fallbacks``. With
    ``kept``, every blob downloaded also stays in memory (see :class:`Kept`).
    """
    steps = retry(lambda: list_steps(src, run_id), policy)
    if not steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {src.url}")
    if step is not None and step not in steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step} in {src.url}")
    candidates = [s for s in reversed(steps) if step is None or s <= step]
    fallbacks: list[str] = []
    for index, candidate in enumerate(candidates):
        try:
            transfer = pull_snapshot(src, dst, run_id, candidate, progress=progress,
                                     policy=policy, kept=kept)
        except (SnapshotError, LinkOutOfStoreError) as exc:  # a link out: damage, as a bad hash
            fallbacks.append(f"step {candidate}: {exc}")
            if log and index + 1 < len(candidates):
                log(f"snapshot {run_id}@{candidate} is unusable ({exc}); "
                    f"falling back to step {candidates[index + 1]}")
            continue
        transfer.fallbacks = fallbacks
        copy_extras(src, dst, run_id, policy)
        return transfer
    raise SnapshotError(f"no snapshot of run {run_id!r} in {src.url} could be pulled intact; "
                        f"newest failure: {fallbacks[0]}")


def pull_snapshot(src: Store, dst: Store, run_id: str, step: int, *,
                  progress: Progress | None = None, policy: RetryPolicy = DEFAULT_RETRY,
                  kept: Kept | None = None) -> Transfer:
    """Copy one snapshot from ``src`` into ``dst``, every blob verified, manifest last."""
    started = time.monotonic()
    raw, manifest = retry(lambda: read_manifest_bytes(src, run_id, step), policy)
    blobs = _sizes(manifest)
    transfer = Transfer(run_id, step, total_bytes=sum(blobs.values()))

    def land(digest: str, size: int) -> None:
        fetch_blob(src, dst, run_id, digest, size, policy, kept, algo=fmt.hash_of(manifest))

    commit(dst, run_id, step, raw, blobs, land, overwrite=True, points="pull", policy=policy,
           on_blob=_counter(transfer, progress))
    transfer.seconds = time.monotonic() - started
    return transfer


Write = Callable[[int, bytes], None]  # (offset, bytes): lands one chunk of a download
HASH_CHUNK = 1 << 20  # a landed part is read back and hashed this much at a time


class Kept:
    """Blobs a pull keeps in memory as well, for a caller about to restore them (a resuming
    run): verified there, they need not be read back from the local tier and hashed again.

    Each blob downloaded lands in ``allocate(size)`` (tensor memory, say), is hashed there,
    and only then written to the local tier; ``blobs`` maps its digest to that buffer.
    Blobs the local tier already had are not downloaded, so not kept: read those there.
    """

    def __init__(self, allocate: Callable[[int], Any] = bytearray) -> None:
        self.allocate = allocate
        self.blobs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def add(self, digest: str, buffer: Any) -> None:
        with self._lock:
            self.blobs[digest] = buffer


@runtime_checkable
class PartReader(Protocol):
    """A store that downloads an object in parallel parts and says, in order, when each
    has landed (:meth:`burst.store.s3.S3Store.read_parts`)."""

    def read_parts(self, key: str, size: int, write: Write, *,
                   policy: RetryPolicy = DEFAULT_RETRY) -> Iterator[tuple[int, int]]: ...


def fetch_blob(src: Store, dst: Store, run_id: str, digest: str, size: int,
               policy: RetryPolicy = DEFAULT_RETRY, kept: Kept | None = None, *,
               algo: str) -> None:
    """Download one blob, check its size and hash, and only then make it visible.

    Into a local tier the bytes land in a temporary file that is renamed into place only
    once the hash matched; retries go through ``policy`` (per part where the store reads
    in parts, else per blob). With ``kept`` they land in its memory first."""
    key = fmt.blob_key(run_id, digest)
    try:
        if kept is not None:
            buffer = kept.allocate(size)
            view = memoryview(buffer).cast("B") if size else memoryview(bytearray())
            _to_memory(src, key, digest, view, policy, algo)
            retry(lambda: dst.put(key, view), policy)
            kept.add(digest, buffer)
        elif isinstance(src, PartReader) and isinstance(dst, LocalStore):
            dst.put_written(key, size, lambda fd: _check(src.url, digest, _parts_to_file(
                src, key, size, fd, policy, algo)))
        elif isinstance(dst, LocalStore):
            dst.put_filled(key, size, lambda view: _check(src.url, digest, retry(
                lambda: _whole(src, key, view, algo), policy)))
        else:
            view = memoryview(bytearray(size))
            _to_memory(src, key, digest, view, policy, algo)
            retry(lambda: dst.put(key, view), policy)
    except KeyError:
        raise SnapshotError(f"blob {digest[:12]} is missing from {src.url}") from None


def _to_memory(src: Store, key: str, digest: str, view: memoryview,
               policy: RetryPolicy, algo: str) -> None:
    """Download into ``view`` and check the hash."""
    if isinstance(src, PartReader):
        _check(src.url, digest, _parts_to_memory(src, key, view, policy, algo))
    else:
        _check(src.url, digest, retry(lambda: _whole(src, key, view, algo), policy))


def _check(url: str, digest: str, actual: str) -> None:
    if actual != digest:
        raise SnapshotError(f"blob {digest[:12]} is corrupt in {url}: "
                            "its bytes do not match its hash")


def _parts_to_file(src: PartReader, key: str, size: int, fd: int,
                   policy: RetryPolicy, algo: str) -> str:
    """Download into ``fd`` by parts; hash each part as soon as it has landed, read back
    while the later parts are still on the wire (hashing lets go of the GIL)."""

    def write(offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    hasher, chunk = fmt.new_hasher(algo), bytearray(HASH_CHUNK)
    for start, end in src.read_parts(key, size, write, policy=policy):
        for offset in range(start, end, HASH_CHUNK):
            n = os.preadv(fd, [memoryview(chunk)[: min(HASH_CHUNK, end - offset)]], offset)
            hasher.update(memoryview(chunk)[:n])
    return hasher.hexdigest()


def _parts_to_memory(src: PartReader, key: str, buffer: memoryview,
                     policy: RetryPolicy, algo: str) -> str:
    """Download into ``buffer`` by parts, hashing each as soon as it has landed."""

    def write(offset: int, data: bytes) -> None:
        buffer[offset : offset + len(data)] = data

    hasher = fmt.new_hasher(algo)
    for start, end in src.read_parts(key, len(buffer), write, policy=policy):
        hasher.update(buffer[start:end])
    return hasher.hexdigest()


def _whole(src: Store, key: str, view: memoryview, algo: str) -> str:
    """Read the whole object into ``view``, check its size, then hash it."""
    actual = src.read_into(key, view)
    if actual != len(view):
        raise SnapshotError(f"{key} is {actual} bytes in {src.url}, the manifest says "
                            f"{len(view)}")
    return fmt.digest(view, algo)


# -- helpers ----------------------------------------------------------------------------


def _sizes(manifest: dict) -> dict[str, int]:
    return {digest: info["size"] for digest, info in manifest["blobs"].items()}


def _counter(transfer: Transfer, progress: Progress | None) -> OnBlob:
    """Count each blob the commit writes or finds there, and report progress."""

    def on_blob(size: int, sent: bool) -> None:
        transfer.count(size, sent)
        _tick(progress, size, transfer.total_bytes)

    return on_blob


def _tick(progress: Progress | None, n: int, total: int) -> None:
    if progress is not None:
        progress(n, total)

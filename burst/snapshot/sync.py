"""Moving snapshots between stores: ``push`` (local tier → remote) and ``pull`` (back).

Push commits the way every writer must: every blob first, each one hash-checked before it
leaves and size-checked once it has landed, then the manifest, the only thing readers look
for, with a conditional write where the server has one, so a snapshot is complete in the
remote store or not there at all. A blob the remote already holds (same content-addressed
name, same size) is not sent again: that is what makes a frozen-backbone fine-tune upload
only what changed, and a killed upload resume without re-sending what it had finished.

While it runs, a push keeps a marker (``<run>/uploads/<step>.json``) listing the blobs it
is about to reference; :mod:`burst.retention` never deletes those, so GC can run during an
upload. After the manifest is written the push checks that every blob is still there and
re-sends any that a concurrent GC removed in the moment between its check and the write.

Pull fetches each blob with parallel ranged reads straight into a temporary file, checks
its hash, and renames it into place; a missing or corrupt blob fails that snapshot and pull
falls back to the newest older complete one, saying so.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from burst import events, killpoints
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot.tiers import check_manifest_size, list_steps
from burst.store import LocalStore, Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry

Progress = Callable[[int, int], None]  # (bytes just done, bytes in this snapshot)
Log = Callable[[str], None]
BLOB_WORKERS = 4
# run files besides snapshots (the lockfile, the code archive) copied whole
EXTRA_DIRS = ("env/", "code/")  # the history (events.jsonl) is merged, not copied


def pending_key(run_id: str, step: int) -> str:
    return fmt.marker_key(run_id, step)


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
    transfers = [push_snapshot(src, dst, run_id, s, progress=progress, policy=policy)
                 for s in chosen]
    copy_extras(src, dst, run_id, policy)
    return transfers


def push_snapshot(src: Store, dst: Store, run_id: str, step: int, *,
                  progress: Progress | None = None, policy: RetryPolicy = DEFAULT_RETRY
                  ) -> Transfer:
    """Commit one snapshot of ``src`` into ``dst``: blobs, verified, then the manifest."""
    started = time.monotonic()
    raw, manifest = _read_manifest(src, run_id, step)
    blobs = {d: info["size"] for d, info in manifest["blobs"].items()}
    transfer = Transfer(run_id, step, total_bytes=sum(blobs.values()))
    key = fmt.manifest_key(run_id, step)
    if retry(lambda: dst.size(key), policy) is not None:
        transfer.manifest = "present"
        _tick(progress, transfer.total_bytes, transfer.total_bytes)
        return transfer
    marker = pending_key(run_id, step)
    retry(lambda: dst.put(marker, _marker(blobs)), policy)
    killpoints.hit("push.marker-written")
    _send_blobs(src, dst, run_id, blobs, transfer, progress, policy)
    killpoints.hit("push.blobs-sent")
    if not retry(lambda: dst.put_if_absent(key, raw), policy):
        transfer.manifest = "present"  # another writer committed this step first: keep theirs
    killpoints.hit("push.manifest-written")
    _repair_missing(src, dst, run_id, blobs, transfer, policy)
    retry(lambda: dst.delete(marker), policy)
    killpoints.hit("push.marker-deleted")
    transfer.seconds = time.monotonic() - started
    return transfer


def _marker(blobs: dict[str, int]) -> bytes:
    return fmt.encode_marker(blobs)


def _send_blobs(src: Store, dst: Store, run_id: str, blobs: dict[str, int], transfer: Transfer,
                progress: Progress | None, policy: RetryPolicy) -> None:
    def one(digest: str) -> None:
        size = blobs[digest]
        present = retry(lambda: dst.size(fmt.blob_key(run_id, digest)), policy) == size
        if not present:
            send_blob(src, dst, run_id, digest, size, policy)
        transfer.count(size, sent=not present)
        _tick(progress, size, transfer.total_bytes)

    _run_all(one, sorted(blobs, key=blobs.__getitem__, reverse=True))


def send_blob(src: Store, dst: Store, run_id: str, digest: str, size: int,
              policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Copy one blob, refusing to send bytes that do not match their name."""
    key = fmt.blob_key(run_id, digest)
    with source_view(src, key, size) as view:
        if fmt.sha256(view) != digest:
            raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is corrupt in {src.url}: "
                                "not uploading it")

        def attempt() -> None:
            killpoints.hit("push.blob")
            dst.put(key, view)
            landed = dst.size(key)
            if landed != size:
                raise SnapshotError(f"blob {digest[:12]} landed in {dst.url} as {landed} bytes, "
                                    f"sent {size}")

        retry(attempt, policy)


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


def _repair_missing(src: Store, dst: Store, run_id: str, blobs: dict[str, int],
                    transfer: Transfer, policy: RetryPolicy) -> None:
    """Re-send blobs a GC running alongside deleted between our check and the manifest."""
    present = set(retry(lambda: dst.list(f"{run_id}/blobs/"), policy))
    for digest, size in blobs.items():
        if fmt.blob_key(run_id, digest) not in present:
            send_blob(src, dst, run_id, digest, size, policy)
            transfer.count(size, sent=True)


def copy_extras(src: Store, dst: Store, run_id: str,
                policy: RetryPolicy = DEFAULT_RETRY) -> int:
    """Copy the run's other files (lockfile, code archive, events) that ``dst`` lacks or
    holds in another version (the side that is copying from has the newer one)."""
    copied = int(retry(lambda: events.merge(src, dst, run_id), policy))
    for directory in EXTRA_DIRS:
        for key in retry(lambda d=directory: src.list(f"{run_id}/{d}"), policy):
            size = src.size(key)
            if size is not None and retry(lambda k=key: dst.size(k), policy) != size:
                data = src.get(key)
                retry(lambda k=key, d=data: dst.put(k, d), policy)
                copied += 1
    return copied


# -- pull -------------------------------------------------------------------------------


def pull(src: Store, dst: Store, run_id: str, step: int | None = None, *,
         progress: Progress | None = None, log: Log | None = None,
         policy: RetryPolicy = DEFAULT_RETRY) -> Transfer:
    """Pull the newest complete snapshot (at or before ``step``) that verifies.

    A snapshot with a missing or corrupt blob is skipped for the next older one; each
    fallback is reported through ``log`` and recorded in ``Transfer.fallbacks``.
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
                                     policy=policy)
        except SnapshotError as exc:
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
                  progress: Progress | None = None, policy: RetryPolicy = DEFAULT_RETRY
                  ) -> Transfer:
    """Copy one snapshot from ``src`` into ``dst``, every blob verified, manifest last."""
    started = time.monotonic()
    raw, manifest = retry(lambda: _read_manifest(src, run_id, step), policy)
    blobs = {d: info["size"] for d, info in manifest["blobs"].items()}
    transfer = Transfer(run_id, step, total_bytes=sum(blobs.values()))

    def one(digest: str) -> None:
        size = blobs[digest]
        present = dst.size(fmt.blob_key(run_id, digest)) == size
        if not present:
            retry(lambda: fetch_blob(src, dst, run_id, digest, size), policy)
        transfer.count(size, sent=not present)
        _tick(progress, size, transfer.total_bytes)

    _run_all(one, sorted(blobs, key=blobs.__getitem__, reverse=True))
    killpoints.hit("pull.blobs-fetched")
    dst.put(fmt.manifest_key(run_id, step), raw)
    transfer.seconds = time.monotonic() - started
    return transfer


def fetch_blob(src: Store, dst: Store, run_id: str, digest: str, size: int) -> None:
    """Download one blob, check its size and hash, and only then make it visible."""
    key = fmt.blob_key(run_id, digest)

    def fill(view: memoryview) -> None:
        try:
            actual = src.read_into(key, view)
        except KeyError:
            raise SnapshotError(f"blob {digest[:12]} is missing from {src.url}") from None
        if actual != size:
            raise SnapshotError(f"blob {digest[:12]} is {actual} bytes in {src.url}, "
                                f"the manifest says {size}")
        if fmt.sha256(view) != digest:
            raise SnapshotError(f"blob {digest[:12]} is corrupt in {src.url}: "
                                "its bytes do not match its hash")

    if isinstance(dst, LocalStore):
        dst.put_filled(key, size, fill)
        return
    buffer = memoryview(bytearray(size))
    fill(buffer)
    dst.put(key, buffer)


# -- helpers ----------------------------------------------------------------------------


def _read_manifest(store: Store, run_id: str, step: int) -> tuple[bytes, dict]:
    check_manifest_size(store, fmt.manifest_key(run_id, step))
    try:
        raw = store.get(fmt.manifest_key(run_id, step))
    except KeyError:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step} in "
                            f"{store.url}") from None
    return raw, fmt.parse_manifest(raw, run_id=run_id, source=f"snapshot {run_id}@{step}")


def _run_all(fn: Callable[[str], None], items: list[str]) -> None:
    """Run ``fn`` over ``items`` on a few threads; the first failure is raised."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(min(BLOB_WORKERS, len(items)), thread_name_prefix="burst-sync") as pool:
        for future in [pool.submit(fn, item) for item in items]:
            future.result()


def _tick(progress: Progress | None, n: int, total: int) -> None:
    if progress is not None:
        progress(n, total)

"""Snapshot tiers: a host-RAM shadow (cheap, every few steps) and a background persister.

The training loop only ever pays for one thing: copying the state's tensors into
preallocated host buffers (the RAM shadow). Hashing, packing and writing to the store
happen on a background thread from that copy (:class:`Tiers` owns both), so the loop keeps
training while a snapshot is made durable.

Two buffer sets let one be persisted while the other takes the next shadow copy; if a
persist is asked for while one is still running, the request is coalesced into the
newest shadow when the thread comes free.

The commit order is what makes a snapshot "complete or invisible": every blob is written
and size-checked first, and the manifest, the only thing readers look for, last.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from burst import killpoints
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.store.base import Store


@dataclass
class Captured:
    """A consistent copy of the training state at one optimizer-step boundary."""

    step: int
    tree: dict[str, Any]  # JSON tree of the state (tensors referenced by name)
    tensors: dict[str, torch.Tensor]  # host-RAM copies, owned by a shadow buffer set
    meta: dict[str, Any]  # manifest fields: counters, batch layout, amp, reason...
    buffers: ShadowBuffers | None = field(default=None, repr=False)


class ShadowBuffers:
    """Preallocated host tensors matching the state; reallocated only when the layout changes."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def copy_from(self, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._matches(live):
            self.tensors = {name: _host_buffer(t) for name, t in live.items()}
        needs_sync = False
        for name, tensor in live.items():
            self.tensors[name].copy_(tensor.detach(), non_blocking=tensor.is_cuda)
            needs_sync |= tensor.is_cuda
        if needs_sync:
            torch.cuda.synchronize()
        return self.tensors

    def _matches(self, live: dict[str, torch.Tensor]) -> bool:
        if self.tensors.keys() != live.keys():
            return False
        return all(
            b.shape == t.shape and b.dtype == t.dtype
            for b, t in zip(self.tensors.values(), live.values(), strict=True)
        )


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    pin = tensor.is_cuda
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)


class Tiers:
    """The RAM shadow and the background persister, sharing two buffer sets.

    States of a buffer set: holding the latest capture, pending (queued for writing),
    being written (never touched until done), or free. A capture always goes to a set
    that is not being written; if that set was pending, the newer capture replaces the
    pending one, so a queued snapshot is never half-overwritten.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        keep: int | None = 3,
        on_commit: Callable[[dict], None] | None = None,
    ) -> None:
        self.store, self.run_id, self.keep = store, run_id, keep
        self.on_commit = on_commit
        self._sets = [ShadowBuffers(), ShadowBuffers()]
        self._cond = threading.Condition()
        self.latest: Captured | None = None
        self._pending: Captured | None = None
        self._writing: Captured | None = None
        self._running = False
        self._error: BaseException | None = None
        self.committed_step: int | None = None

    def capture(self, step: int, tree: dict, live: dict[str, torch.Tensor], meta: dict,
                persist: bool = False) -> Captured:
        """Copy ``live`` into host RAM (the only cost the training loop pays)."""
        with self._cond:
            buffers = self._free_set()
            replaced_pending = self._pending is not None and self._pending.buffers is buffers
            if replaced_pending:
                self._pending = None
            if self.latest is not None and self.latest.buffers is buffers:
                self.latest = None  # about to be overwritten
        captured = Captured(step, tree, buffers.copy_from(live), meta, buffers)
        with self._cond:
            self.latest = captured
        if persist or replaced_pending:
            self.persist(captured)
        return captured

    def _free_set(self) -> ShadowBuffers:
        writing = self._writing.buffers if self._writing else None
        candidates = [s for s in self._sets if s is not writing]
        latest = self.latest.buffers if self.latest else None
        return next((s for s in candidates if s is not latest), candidates[0])

    def persist(self, captured: Captured | None = None) -> None:
        """Queue ``captured`` (default: the latest capture) for writing in the background."""
        captured = captured or self.latest
        if captured is None:
            return
        with self._cond:
            self._pending = captured
            if not self._running:
                self._running = True
                threading.Thread(target=self._work, name="burst-persist", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                captured, self._pending = self._pending, None
                self._writing = captured
                if captured is None:
                    self._running = False
                    self._cond.notify_all()
                    return
            try:
                manifest = write_snapshot(self.store, self.run_id, captured)
                self.committed_step = captured.step
                if self.keep:
                    prune(self.store, self.run_id, self.keep)
                if self.on_commit:
                    self.on_commit(manifest)
            except BaseException as exc:  # surfaced to the training thread by flush()
                with self._cond:
                    self._error = exc
                # said now, too: a loop that never flushes would otherwise train for hours
                # believing it is protected (a full disk, a revoked mount)
                warnings.warn(f"burst: the snapshot of step {captured.step} could not be "
                              f"written ({_one_line(exc)}); the previous snapshot is kept",
                              RuntimeWarning, stacklevel=1)
            finally:
                with self._cond:
                    self._writing = None

    def busy(self) -> bool:
        with self._cond:
            return self._running

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued snapshot is written; re-raise a background failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._running:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise SnapshotError(f"snapshot persist did not finish within {timeout:.0f}s")
                self._cond.wait(remaining)
            error, self._error = self._error, None
        if error is not None:
            if isinstance(error, SnapshotError):
                raise error
            raise SnapshotError(f"writing a snapshot failed: {error}") from error


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def write_snapshot(store: Store, run_id: str, captured: Captured) -> dict:
    """Commit ``captured``: blobs first (skipping ones the store has), then the manifest.

    A marker naming the blobs is written before them and removed after the manifest, so a
    ``burst gc`` running meanwhile keeps them (:mod:`burst.retention`); a blob that was
    skipped because it existed, and that such a GC deleted anyway, is written again.
    """
    blobs = fmt.layout_blobs(captured.tensors)
    tensor_entries: dict[str, dict] = {}
    blob_sizes: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        digests = list(pool.map(lambda b: fmt.sha256(b.payload(captured.tensors)), blobs))
        marker = fmt.marker_key(run_id, captured.step)
        store.put(marker, fmt.encode_marker(digests))
        killpoints.hit("snapshot.marker-written")
        skipped = list(pool.map(lambda b, d: _write_blob(store, run_id, b, d, captured.tensors),
                                blobs, digests))
    for blob, digest in zip(blobs, digests, strict=True):
        blob_sizes[digest] = {"size": blob.size}
        for name, offset in zip(blob.names, blob.offsets, strict=True):
            tensor_entries[name] = fmt.tensor_entry(captured.tensors[name], digest, offset)
    killpoints.hit("snapshot.blobs-written")
    manifest = {
        **captured.meta,
        "format": fmt.FORMAT_VERSION,
        "run_id": run_id,
        "step": captured.step,
        "state": captured.tree,
        "tensors": tensor_entries,
        "blobs": blob_sizes,
    }
    store.put(fmt.manifest_key(run_id, captured.step), fmt.encode_manifest(manifest))
    killpoints.hit("snapshot.manifest-written")
    for blob, digest, was_there in zip(blobs, digests, skipped, strict=True):
        if was_there and store.size(fmt.blob_key(run_id, digest)) != blob.size:
            _write_blob(store, run_id, blob, digest, captured.tensors)  # a GC raced us
    store.delete(marker)
    killpoints.hit("snapshot.marker-deleted")
    return manifest


def _write_blob(store: Store, run_id: str, blob: fmt.Blob, digest: str, tensors: dict) -> bool:
    """Write one blob unless the store has it; True if it was already there."""
    key = fmt.blob_key(run_id, digest)
    if store.size(key) == blob.size:
        return True  # content-addressed: the same bytes are already there
    killpoints.hit("snapshot.blob")
    store.put(key, blob.payload(tensors))
    written = store.size(key)
    if written != blob.size:
        raise SnapshotError(f"blob {digest[:12]} reads back as {written} bytes, wrote {blob.size}")
    return False


def list_steps(store: Store, run_id: str) -> list[int]:
    """Steps of the complete snapshots of ``run_id`` (those with a manifest), ascending."""
    steps = (fmt.step_of_manifest_key(k) for k in store.list(f"{run_id}/snapshots/"))
    return sorted(s for s in steps if s is not None)


def read_manifest(store: Store, run_id: str, step: int | None = None) -> dict | None:
    """The manifest at ``step`` (default: the newest); None if the run has no snapshot."""
    if step is None:
        steps = list_steps(store, run_id)
        if not steps:
            return None
        step = steps[-1]
    key = fmt.manifest_key(run_id, step)
    check_manifest_size(store, key)
    try:
        data = store.get(key)
    except KeyError:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step}") from None
    return fmt.parse_manifest(data, run_id=run_id, source=f"snapshot {run_id}@{step}")


def check_manifest_size(store: Store, key: str) -> None:
    """Refuse to read a "manifest" bigger than any real one (a hostile or broken store)."""
    size = store.size(key)
    if size is not None and size > fmt.MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{key} in {store.url} is {size} bytes: too big to be a manifest")


def load_tensors(store: Store, manifest: dict) -> dict[str, torch.Tensor]:
    """Read and verify every blob of ``manifest``; return its tensors (views into the blobs)."""
    by_blob: dict[str, list[str]] = {}
    for name, entry in manifest["tensors"].items():
        by_blob.setdefault(entry["blob"], []).append(name)
    run_id = manifest["run_id"]

    def load(digest: str) -> dict[str, torch.Tensor]:
        data = read_blob(store, run_id, digest, manifest["blobs"][digest]["size"])
        return fmt.tensors_from_blob(manifest, digest, data, by_blob[digest])

    tensors: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for part in pool.map(load, by_blob):
            tensors.update(part)
    return tensors


def read_blob(store: Store, run_id: str, digest: str, size: int) -> torch.Tensor:
    """One blob's bytes, size- and hash-checked; never allocates more than the manifest said."""
    key = fmt.blob_key(run_id, digest)
    actual = store.size(key)
    if actual is None:
        raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the store")
    if actual != size:
        raise SnapshotError(f"blob {digest[:12]} is {actual} bytes, the manifest says {size}")
    try:
        data = torch.empty(size, dtype=torch.uint8)
    except (RuntimeError, MemoryError):  # a hostile manifest, or simply too big for here
        raise SnapshotError(f"blob {digest[:12]} needs {size} bytes of memory, more than this "
                            "machine can allocate") from None
    view = memoryview(data.numpy()).cast("B") if size else memoryview(bytearray())
    if store.read_into(key, view) != size:
        raise SnapshotError(f"blob {digest[:12]} changed size while being read")
    if fmt.sha256(view) != digest:
        raise SnapshotError(f"blob {digest[:12]} is corrupt: its bytes do not match its hash")
    return data


def verify(store: Store, run_id: str, step: int | None = None) -> dict:
    """Check one snapshot end to end (manifest, every blob's size and hash); return it."""
    manifest = read_manifest(store, run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    for digest, info in manifest["blobs"].items():
        read_blob(store, run_id, digest, info["size"])
    return manifest


def prune(store: Store, run_id: str, keep: int) -> list[int]:
    """Keep the newest ``keep`` snapshots; delete older manifests, then unreferenced blobs.

    A thin wrapper over :func:`burst.retention.gc`, which owns the ordering that keeps this
    safe against crashes and concurrent uploads; returns the dropped steps.
    """
    from burst.snapshot import retention  # retention reads manifests through this module

    if keep < 1 or len(list_steps(store, run_id)) <= keep:
        return []
    return retention.gc(store, run_id, keep_last=keep).dropped

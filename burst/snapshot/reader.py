"""Reading snapshots without torch: which steps a run has, their manifests, their blobs.

A snapshot exists when its manifest does (:mod:`burst.snapshot.commit` writes it last), so
listing manifests is listing complete snapshots. Everything that looks at a store (the
catalog, retention, push and pull, status, resume planning) reads through here; only
restoring tensors needs torch, and that lives in :mod:`burst.snapshot.tensors`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.store.base import Store

Buffer = TypeVar("Buffer")  # anything memoryview() can write into: bytearray, an ndarray


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
    return read_manifest_bytes(store, run_id, step)[1]


def read_manifest_bytes(store: Store, run_id: str, step: int) -> tuple[bytes, dict]:
    """The manifest at ``step`` as stored (to copy it byte for byte) and as parsed."""
    key = fmt.manifest_key(run_id, step)
    check_manifest_size(store, key)
    try:
        raw = store.get(key)
    except KeyError:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step} in "
                            f"{store.url}") from None
    return raw, fmt.parse_manifest(raw, run_id=run_id, source=f"snapshot {run_id}@{step}")


def check_manifest_size(store: Store, key: str) -> None:
    """Refuse to read a "manifest" bigger than any real one (a hostile or broken store)."""
    size = store.size(key)
    if size is not None and size > fmt.MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{key} in {store.url} is {size} bytes: too big to be a manifest")


def read_blob(store: Store, run_id: str, digest: str, size: int,
              allocate: Callable[[int], Buffer] = bytearray) -> Buffer:
    """One blob's bytes, size- and hash-checked, in a buffer from ``allocate(size)``.

    The size comes from the manifest and is checked against the store before anything is
    allocated, so a hostile store cannot make this allocate more than the manifest said.
    A restore passes an allocator of tensor memory; ``verify`` takes plain bytes.
    """
    key = fmt.blob_key(run_id, digest)
    actual = store.size(key)
    if actual is None:
        raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the store")
    if actual != size:
        raise SnapshotError(f"blob {digest[:12]} is {actual} bytes, the manifest says {size}")
    try:
        buffer = allocate(size)
    except (MemoryError, OverflowError, RuntimeError):  # a hostile manifest, or too big here
        raise SnapshotError(f"blob {digest[:12]} needs {size} bytes of memory, more than this "
                            "machine can allocate") from None
    view = memoryview(buffer).cast("B") if size else memoryview(bytearray())
    if store.read_into(key, view) != size:
        raise SnapshotError(f"blob {digest[:12]} changed size while being read")
    if fmt.sha256(view) != digest:
        raise SnapshotError(f"blob {digest[:12]} is corrupt: its bytes do not match its hash")
    return buffer


def verify(store: Store, run_id: str, step: int | None = None) -> dict:
    """Check one snapshot end to end (manifest, every blob's size and hash); return it."""
    manifest = read_manifest(store, run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    for digest, info in manifest["blobs"].items():
        read_blob(store, run_id, digest, info["size"])
    return manifest

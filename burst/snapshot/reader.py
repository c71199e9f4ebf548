"""Reading snapshots without torch: which steps a run has, their manifests, their blobs.

A snapshot exists when its manifest does (:mod:`burst.snapshot.commit` writes it last), so
listing manifests is listing complete snapshots. Everything that looks at a store (the
catalog, retention, push and pull, status, resume planning) reads through here; only
restoring tensors needs torch, and that lives in :mod:`burst.snapshot.tensors`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar, runtime_checkable

from burst.errors import LinkOutOfStoreError, SnapshotError
from burst.snapshot import damaged
from burst.snapshot import format as fmt
from burst.snapshot import index as index_files
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
    raw, _key = _manifest_raw(store, run_id, step)
    source = f"snapshot {run_id}@{step}"
    manifest = fmt.parse_manifest(raw, run_id=run_id, step=step, source=source)
    return raw, with_indexes(store, manifest, source)


def with_indexes(store: Store, manifest: dict, source: str) -> dict:
    """A parsed manifest with the tensor table of its index files merged in (read whole
    and hash-checked like blobs; :mod:`burst.snapshot.index`); one without index files
    as it is."""
    digests = index_files.listed(manifest, source)
    if not digests:
        return manifest
    run_id, algo = manifest["run_id"], fmt.hash_of(manifest)

    def read(digest: str) -> dict:
        data: bytearray = read_blob(store, run_id, digest, manifest["blobs"][digest]["size"], algo=algo)
        return index_files.parse(data, manifest, digest, source)

    with ThreadPoolExecutor(min(4, len(digests)), thread_name_prefix="burst-index") as pool:
        return index_files.expand(manifest, list(pool.map(read, digests)))


def referenced_blobs(store: Store, run_id: str, step: int) -> frozenset[str]:
    """The digests of the blobs a snapshot references.

    A persist prunes after every write, and re-parsing and re-validating the kept
    manifests each time cost a persist more than writing its own; a manifest's bytes
    are parsed once (the last few are remembered, and the writer hands over the ones it
    wrote through :func:`remember_digests`), and bytes that differ in any way are parsed
    and validated afresh."""
    raw, _ = _manifest_raw(store, run_id, step)
    key = (bytes(raw), run_id, step)
    with _PARSED_LOCK:
        known = _PARSED.get(key)
    if known is not None:
        return known
    source = f"snapshot {run_id}@{step}"
    manifest = fmt.parse_manifest(key[0], run_id=run_id, step=step, source=source)
    digests = frozenset(with_indexes(store, manifest, source)["blobs"])
    remember_digests(key[0], run_id, step, digests)
    return digests


def remember_digests(raw: bytes, run_id: str, step: int, digests: frozenset[str]) -> None:
    """Note that the manifest ``raw`` of ``run_id@step`` references ``digests``: its writer
    built it from them, so the prune that follows need not parse it back."""
    with _PARSED_LOCK:
        _PARSED[(raw, run_id, step)] = digests
        _PARSED.move_to_end((raw, run_id, step))
        while len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)


# (manifest bytes, run, step) -> the digests it references; the newest few
_PARSED: OrderedDict[tuple[bytes, str, int], frozenset[str]] = OrderedDict()
_PARSED_MAX = 8
_PARSED_LOCK = threading.Lock()


def _manifest_raw(store: Store, run_id: str, step: int) -> tuple[bytes, str]:
    key = fmt.manifest_key(run_id, step)
    check_manifest_size(store, key)
    try:
        return store.get(key), key
    except KeyError:
        raise SnapshotError(f"run {run_id!r} has no snapshot at step {step} in "
                            f"{store.url}") from None


def check_manifest_size(store: Store, key: str) -> None:
    """Refuse to read a "manifest" bigger than any real one (a hostile or broken store):
    its size is asked first, so a huge one is never downloaded or parsed."""
    size = store.size(key)
    if size is not None and size > fmt.MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{key} in {store.url} is {size} bytes: too big to be a manifest "
                            f"(at most {fmt.MAX_MANIFEST_BYTES >> 20} MiB)")


def newest_intact(store: Store, run_id: str, log: Callable[[str], None], *,
                  refused: Collection[int] = ()) -> dict | None:
    """The newest snapshot whose manifest parses and whose every blob verifies; None if
    the run has none at all.

    The one fallback rule for every store (a pull from a remote applies the same one):
    a damaged newer snapshot is skipped for the next older one, and each skip is told to
    ``log`` (a warning and an event, where a run resumes), never silently. If no snapshot
    is intact, the newest one's failure is raised: starting over would lose the run.
    ``refused``: steps the fence refuses (:mod:`burst.snapshot.restorable`), never chosen.
    """
    return _newest(store, run_id, log, verify, "intact", refused=refused)


def is_sharded(manifest: dict) -> bool:
    """Whether a snapshot was written in pieces by several ranks (format 2 or 4): its
    ranks restore straight from the store, each reading its own byte ranges."""
    return manifest.get("format") in fmt.SHARDED_VERSIONS


def newest_complete(store: Store, run_id: str, log: Callable[[str], None], *,
                    below: int | None = None) -> dict | None:
    """The newest snapshot whose manifest parses and whose every blob is there at its
    size; None if the run has none at all. The fallback rule is :func:`newest_intact`'s.

    For a restore on several ranks straight from the store (a sharded snapshot): hashing
    every blob here would have one rank download the whole state, which is what sharding
    avoids. Each rank checks the hashes of the bytes it reads instead
    (:mod:`burst.snapshot.shards`), so a corrupt shard still never loads; when one does
    not, the ranks fall back together to the newest complete snapshot ``below`` its step
    (:mod:`burst.parallel.fallback`)."""
    return _newest(store, run_id, log, _complete, "complete", below=below)


def _newest(store: Store, run_id: str, log: Callable[[str], None],
            check: Callable[[Store, str, int], dict], usable: str, *,
            below: int | None = None, refused: Collection[int] = ()) -> dict | None:
    """The newest step (before ``below``) ``check`` accepts, each newer one it refuses
    told to ``log``."""
    steps = [s for s in list_steps(store, run_id)
             if (below is None or s < below) and s not in refused]
    failures: list[str] = []
    for index, step in enumerate(reversed(steps)):
        try:
            return check(store, run_id, step)
        except (SnapshotError, LinkOutOfStoreError) as exc:  # a link out: damage, as a bad hash
            failures.append(f"step {step}: {exc}")
            if index + 1 < len(steps):
                log(f"snapshot {run_id}@{step} is unusable ({exc}); falling back to step "
                    f"{steps[-index - 2]}")
    if not failures:
        return None
    raise SnapshotError(f"no snapshot of run {run_id!r} in {store.url} is {usable}; newest "
                        f"failure: {failures[0]}")


def _complete(store: Store, run_id: str, step: int) -> dict:
    manifest = read_manifest(store, run_id, step)
    assert manifest is not None  # a listed step

    def check(item: tuple[str, dict]) -> None:
        digest, info = item
        size = store.size(fmt.blob_key(run_id, digest))
        if size is None:
            raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the "
                                "store")
        if size != info["size"]:
            raise SnapshotError(f"blob {digest[:12]} is {size} bytes, the manifest says "
                                f"{info['size']}")

    blobs = list(manifest["blobs"].items())
    with ThreadPoolExecutor(min(8, len(blobs) or 1), thread_name_prefix="burst-check") as pool:
        list(pool.map(check, blobs))
    return manifest


def read_blob(store: Store, run_id: str, digest: str, size: int,
              allocate: Callable[[int], Buffer] = bytearray, *, algo: str,  # type: ignore[assignment]  # mypy cannot default a TypeVar's callable; bytearray makes one
              check_hash: bool = True) -> Buffer:
    """One blob's bytes, size- and hash-checked (by ``algo``, the manifest's
    :func:`~burst.snapshot.format.hash_of`), in a buffer from ``allocate(size)``.

    The size comes from the manifest and is checked against the store before anything is
    allocated, so a hostile store cannot make this allocate more than the manifest said.
    A restore passes an allocator of tensor memory; ``verify`` takes plain bytes.
    ``check_hash=False`` only for a blob this process has just verified in its own local
    tier (:func:`newest_intact` then the restore): hashing it twice doubles a restore.
    """
    key = fmt.blob_key(run_id, digest)
    _check_size(run_id, digest, store.size(key), size)
    try:
        buffer = allocate(size)
    except (MemoryError, OverflowError, RuntimeError):  # a hostile manifest, or too big here
        raise SnapshotError(f"blob {digest[:12]} needs {size} bytes of memory, more than this "
                            "machine can allocate") from None
    view = memoryview(buffer).cast("B") if size else memoryview(bytearray())  # type: ignore[arg-type]  # a Buffer takes writes (the TypeVar's promise)
    if store.read_into(key, view) != size:
        raise SnapshotError(f"blob {digest[:12]} changed size while being read")
    if check_hash:
        checked(store, run_id, digest, view, algo)
    return buffer


def _check_size(run_id: str, digest: str, actual: int | None, size: int) -> None:
    if actual is None:
        raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the store")
    if actual != size:
        raise SnapshotError(f"blob {digest[:12]} is {actual} bytes, the manifest says {size}")


def check_digest(digest: str, data: bytes | memoryview, algo: str) -> None:
    """Refuse ``data`` unless its hash by ``algo`` is ``digest`` (the blob's name)."""
    if fmt.digest(data, algo) != digest:
        raise SnapshotError(f"blob {digest[:12]} is corrupt: its bytes do not match its hash")


def checked(store: Store, run_id: str, digest: str, data: bytes | memoryview,
            algo: str) -> None:
    """:func:`check_digest` on bytes read from ``store``; a blob damaged there is deleted
    (:mod:`burst.snapshot.damaged`: the next persist writes it again) before the refusal."""
    try:
        check_digest(digest, data, algo)
    except SnapshotError:
        if damaged.condemn(store, run_id, digest, algo):
            raise SnapshotError(f"blob {digest[:12]} is corrupt: its bytes do not match its "
                                f"hash (deleted from {store.url}: the next snapshot writes "
                                "it again)") from None
        raise


@runtime_checkable
class Mapped(Protocol):
    """A store that maps an object's bytes read-only (:meth:`burst.store.LocalStore.view`)."""

    def view(self, key: str) -> AbstractContextManager[memoryview]: ...


@runtime_checkable
class FileBacked(Protocol):
    """A store whose objects are files a reader may map (:meth:`burst.store.LocalStore.file_of`)."""

    def file_of(self, key: str) -> tuple[str, int]: ...


def blob_file(store: FileBacked, run_id: str, digest: str, size: int) -> str:
    """The file holding one blob, its size checked against the manifest's; hash it with
    :func:`check_digest` once mapped."""
    try:
        path, actual = store.file_of(fmt.blob_key(run_id, digest))
    except KeyError:
        path, actual = "", None
    _check_size(run_id, digest, actual, size)
    return path


def check_blob(store: Store, run_id: str, digest: str, size: int,
               chunks: list[str] | None = None, *, algo: str) -> None:
    """Check one blob's size and hash (and its ``chunks`` hashes, if the manifest lists
    them), keeping none of its bytes: hashed straight from the file's pages where the
    store maps them (a local tier: no buffer to allocate and fill), else read into
    scratch memory."""
    if not isinstance(store, Mapped):
        _check_chunks(digest, read_blob(store, run_id, digest, size, algo=algo), chunks, algo)
        return
    try:
        with store.view(fmt.blob_key(run_id, digest)) as view:
            _check_size(run_id, digest, len(view), size)
            checked(store, run_id, digest, view, algo)
            _check_chunks(digest, view, chunks, algo)
    except KeyError:
        raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the "
                            "store") from None


def _check_chunks(digest: str, data: bytes | bytearray | memoryview,
                  chunks: list[str] | None, algo: str) -> None:
    """A blob whose name matches its bytes but whose chunk hashes do not would pass a
    whole read and fail every ranged one (format 2): such a snapshot is not intact."""
    if chunks is not None and fmt.chunk_digests(data, algo) != chunks:
        raise SnapshotError(f"blob {digest[:12]} has chunk hashes that do not match its bytes")


def verify(store: Store, run_id: str, step: int | None = None) -> dict:
    """Check one snapshot end to end (manifest, every blob's size and hash, and the chunk
    hashes format 2 lists); return it. Blobs are checked a few at a time (hashing lets go
    of the GIL)."""
    manifest = read_manifest(store, run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    blobs, algo = manifest["blobs"], fmt.hash_of(manifest)
    with ThreadPoolExecutor(min(4, len(blobs) or 1), thread_name_prefix="burst-verify") as pool:
        checks = [pool.submit(check_blob, store, run_id, digest, info["size"],
                              info.get("chunks"), algo=algo)
                  for digest, info in blobs.items()]
        for check in checks:
            check.result()
    return manifest

"""The torch side of the snapshot format: tensors into blobs, and verified blobs back.

Only capturing (:mod:`burst.snapshot.tiers`) and restoring import this module, so every
command that merely looks at or moves snapshots runs without importing torch. The layout
rules (packing, alignment, the dtype sizes a manifest is checked against) are the format's,
in :mod:`burst.snapshot.format`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, shards, sync
from burst.store.base import Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy

# The format's dtypes this torch has (older ones lack the unsigned and float8 kinds).
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in fmt.ITEMSIZES
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without copying."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data.cast("B")  # the array's buffer


@dataclass
class Blob:
    """One blob to write: the tensors it holds and where each starts."""

    names: list[str]
    offsets: list[int]
    size: int

    def payload(self, tensors: dict[str, torch.Tensor]) -> memoryview:
        """The blob's bytes; a single-tensor blob is the tensor's own memory, uncopied."""
        if len(self.names) == 1 and self.offsets[0] == 0:
            return tensor_bytes(tensors[self.names[0]])
        out = bytearray(self.size)
        for name, offset in zip(self.names, self.offsets, strict=True):
            data = tensor_bytes(tensors[name])
            out[offset : offset + len(data)] = data
        return memoryview(out)


def layout_blobs(tensors: dict[str, torch.Tensor]) -> list[Blob]:
    """Group tensors into blobs: big ones alone, small ones packed in order."""
    blobs: list[Blob] = []
    pack = Blob([], [], 0)
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= fmt.PACK_THRESHOLD:
            blobs.append(Blob([name], [0], nbytes))
            continue
        offset = _align(pack.size)
        pack.names.append(name)
        pack.offsets.append(offset)
        pack.size = offset + nbytes
        if pack.size >= fmt.PACK_LIMIT:
            blobs.append(pack)
            pack = Blob([], [], 0)
    if pack.names:
        blobs.append(pack)
    return blobs


def _align(n: int) -> int:
    return (n + fmt.ALIGN - 1) // fmt.ALIGN * fmt.ALIGN


def tensor_entry(tensor: torch.Tensor, digest: str, offset: int) -> dict[str, Any]:
    return {
        "blob": digest,
        "dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape),
        "offset": offset,
        "nbytes": tensor.numel() * tensor.element_size(),
    }


def tensors_from_blob(
    manifest: dict, digest: str, data: torch.Tensor, names: Iterable[str]
) -> dict[str, torch.Tensor]:
    """Views into a verified blob's bytes for the named tensors (checked by parse_manifest).

    Tensors with the same bytes share one blob (it is named by its hash): all-zero Adam
    moments of equal-sized layers, say. Each still gets memory of its own, a copy for
    all but the first over the same bytes, or an optimizer that keeps the restored
    tensors would update one and see it in all of them."""
    entries = manifest["tensors"]
    out = {}
    handed_out = 0  # the blob's bytes below this are some tensor's already
    for name in sorted(names, key=lambda n: entries[n]["offset"]):
        entry = entries[name]
        dtype = DTYPES[entry["dtype"]]
        start, end = entry["offset"], entry["offset"] + entry["nbytes"]
        if start == end:
            out[name] = torch.empty(entry["shape"], dtype=dtype)
            continue
        tensor = data[start:end].view(dtype).reshape(entry["shape"])
        out[name] = tensor.clone() if start < handed_out else tensor
        handed_out = max(handed_out, end)
    return out


def read_blob(store: Store, run_id: str, digest: str, size: int, *, algo: str,
              check_hash: bool = True) -> torch.Tensor:
    """One blob's bytes as a uint8 tensor, size- and hash-checked (:func:`reader.read_blob`).

    From a store of files (a local tier) the tensor is the file mapped copy-on-write
    (``torch.from_file``, which keeps no file descriptor open: a snapshot of thousands of
    blobs maps them all at once): nothing is read up front, as with
    torch's own mapped loading, and a write to the tensor never reaches the file."""
    tensor = _mapped(store, run_id, digest, size) if isinstance(store, reader.FileBacked) else None
    if tensor is None:
        data = reader.read_blob(store, run_id, digest, size, _allocate, algo=algo,
                                check_hash=check_hash)
        return torch.from_numpy(data)
    if check_hash:
        reader.checked(store, run_id, digest, tensor.numpy().data, algo)
    return tensor


def _mapped(store: reader.FileBacked, run_id: str, digest: str, size: int
            ) -> torch.Tensor | None:
    """The blob's file mapped copy-on-write, or None where it cannot be (a filesystem
    without ``mmap``, a file shrunk since its size was read, no memory to map): the
    blob is then read, which checks all of that again and says what went wrong."""
    path = reader.blob_file(store, run_id, digest, size)
    if not size:
        return torch.empty(0, dtype=torch.uint8)
    try:
        return torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    except RuntimeError:
        return None


def _allocate(size: int) -> Any:
    return torch.empty(size, dtype=torch.uint8).numpy()


def load_tensors(store: Store, manifest: dict, kept: Mapping[str, Any] | None = None, *,
                 verified: bool = False) -> dict[str, torch.Tensor]:
    """Read and verify every blob of ``manifest``; return its tensors (a whole entry's are
    views into its blob; a sharded entry's (format 2) are assembled from their shards).

    Blobs in ``kept`` (digest -> the verified buffer a pull left them in) are used where
    they are instead of being read again (:func:`pull_tensors`). ``verified``: this
    process has just checked every blob's hash in ``store`` (a local tier it owns), so
    sizes are checked and hashes are not computed a second time."""
    _check_dtypes(manifest)
    by_blob: dict[str, list[str]] = {}
    sharded: list[str] = []
    for name, entry in manifest["tensors"].items():
        if fmt.is_sharded(entry):
            sharded.append(name)
        else:
            by_blob.setdefault(entry["blob"], []).append(name)
    run_id = manifest["run_id"]
    loaded: dict[str, Any] = dict(kept or {})  # digest -> verified bytes, for the shards

    def load(digest: str) -> dict[str, torch.Tensor]:
        if kept is not None and digest in kept:
            data = torch.from_numpy(kept[digest])
        else:
            data = read_blob(store, run_id, digest, manifest["blobs"][digest]["size"],
                             algo=fmt.hash_of(manifest), check_hash=not verified)
            loaded[digest] = data.numpy()
        return tensors_from_blob(manifest, digest, data, by_blob[digest])

    tensors: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for part in pool.map(load, by_blob):
            tensors.update(part)
        if sharded:
            cache = shards.BlobCache(kept=loaded, check_hash=not verified)
            wholes = pool.map(lambda n: shards.read_whole(store, manifest, n, blobs=cache),
                              sharded)
            tensors.update(zip(sharded, wholes, strict=True))
    return {name: tensors[name] for name in manifest["tensors"]}


def pull_tensors(src: Store, dst: Store, run_id: str, step: int | None = None, *,
                 log: sync.Log | None = None, policy: RetryPolicy = DEFAULT_RETRY
                 ) -> tuple[sync.Transfer, dict, dict[str, torch.Tensor]]:
    """Pull the newest intact snapshot (at or before ``step``) into ``dst`` and return it
    with its tensors, for a run that resumes from it at once.

    Each downloaded blob lands in tensor memory, is hashed there, and is written to
    ``dst`` from there (:class:`burst.snapshot.sync.Kept`): the restore reads nothing back
    from the local tier except the blobs it already had, which are verified as read."""
    kept = sync.Kept(_allocate)
    transfer = sync.pull(src, dst, run_id, step, log=log, policy=policy, kept=kept)
    manifest = reader.read_manifest(dst, run_id, transfer.step)
    assert manifest is not None  # the pull just committed it
    return transfer, manifest, load_tensors(dst, manifest, kept=kept.blobs)


def _check_dtypes(manifest: dict) -> None:
    """Refuse, before reading a byte, a snapshot holding a dtype this torch does not have."""
    missing = sorted({e["dtype"] for e in manifest["tensors"].values()} - DTYPES.keys())
    if missing:
        raise SnapshotError(f"snapshot {manifest['run_id']}@{manifest['step']} holds tensors of "
                            f"dtype {', '.join(missing)}, which torch {torch.__version__} lacks "
                            "(upgrade torch to restore it)")

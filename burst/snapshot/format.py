"""Snapshot format v1: a JSON manifest plus content-addressed blobs of raw tensor bytes.

A manifest names every tensor with its blob, byte offset, dtype and shape. A blob's name
is the SHA-256 of its bytes, so a tensor that did not change since the last snapshot (a
frozen embedding, say) lands in a blob that already exists and is not written again.
Tensors under ``PACK_THRESHOLD`` bytes are packed together so a model with thousands of
small biases does not become thousands of objects.

Nothing here unpickles. Reading a snapshot parses JSON, checks every declared size
against every other before allocating, and verifies each blob's hash before any tensor
built from it is returned.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from burst.errors import SnapshotError

FORMAT_VERSION = 1
PACK_THRESHOLD = 1 << 20  # tensors smaller than this share a pack blob
PACK_LIMIT = 64 << 20  # a pack blob is closed once it reaches this size
ALIGN = 64  # every tensor starts at a multiple of this within its blob
MAX_MANIFEST_BYTES = 256 << 20  # far above any real manifest; a bigger one is hostile
MAX_DIMS = 64  # torch allows at most 64 dimensions
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
        "int64", "int32", "int16", "int8", "uint8", "bool",
        "uint16", "uint32", "uint64",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def blob_key(run_id: str, digest: str) -> str:
    return f"{run_id}/blobs/{digest[:2]}/{digest}"


def manifest_key(run_id: str, step: int) -> str:
    return f"{run_id}/snapshots/{step:012d}.json"


def marker_key(run_id: str, step: int) -> str:
    """A write in progress: the blobs it will reference, kept from GC until it commits."""
    return f"{run_id}/uploads/{step:012d}.json"


def encode_marker(digests: Iterable[str]) -> bytes:
    return json.dumps({"time": time.time(), "blobs": sorted(digests)}).encode()


def step_of_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".json") or not name[:-5].isdigit():
        return None
    return int(name[:-5])


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without copying."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


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
        if nbytes >= PACK_THRESHOLD:
            blobs.append(Blob([name], [0], nbytes))
            continue
        offset = _align(pack.size)
        pack.names.append(name)
        pack.offsets.append(offset)
        pack.size = offset + nbytes
        if pack.size >= PACK_LIMIT:
            blobs.append(pack)
            pack = Blob([], [], 0)
    if pack.names:
        blobs.append(pack)
    return blobs


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def sha256(data: memoryview | bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_entry(tensor: torch.Tensor, digest: str, offset: int) -> dict[str, Any]:
    return {
        "blob": digest,
        "dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape),
        "offset": offset,
        "nbytes": tensor.numel() * tensor.element_size(),
    }


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False).encode()


def parse_manifest(data: bytes, *, run_id: str | None = None, source: str = "manifest") -> dict:
    """Parse and validate a manifest; every later size check relies on what this accepts."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{source} is {len(data)} bytes: too big to be a manifest")
    try:
        manifest = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{source} is not valid JSON ({exc})") from None
    except RecursionError:
        raise SnapshotError(f"{source} is nested too deeply to be a manifest") from None
    if not isinstance(manifest, dict):
        raise SnapshotError(f"{source} is not a JSON object")
    version = manifest.get("format")
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"{source} has snapshot format {version!r}; this burst reads format {FORMAT_VERSION} "
            "(upgrade burst to read newer snapshots)"
        )
    for field, kind in (("run_id", str), ("step", int), ("tensors", dict), ("blobs", dict),
                        ("state", dict)):
        if not isinstance(manifest.get(field), kind):
            raise SnapshotError(f"{source} lacks a valid {field!r} field")
    if run_id is not None and manifest["run_id"] != run_id:
        raise SnapshotError(f"{source} belongs to run {manifest['run_id']!r}, not {run_id!r}")
    _check_blobs(manifest["blobs"], source)
    for name, entry in manifest["tensors"].items():
        _check_tensor_entry(name, entry, manifest["blobs"], source)
    return manifest


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_blobs(blobs: dict, source: str) -> None:
    for digest, info in blobs.items():
        if not _DIGEST.match(digest):
            raise SnapshotError(f"{source} names a blob {digest!r} that is not a SHA-256 digest")
        if not isinstance(info, dict) or not _is_count(info.get("size")):
            raise SnapshotError(f"{source} gives blob {digest[:12]} no valid size")


def _check_tensor_entry(name: str, entry: Any, blobs: dict, source: str) -> None:
    if not isinstance(entry, dict):
        raise SnapshotError(f"{source}: tensor {name!r} has a malformed entry")
    dtype = DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
    shape = entry.get("shape")
    offset, nbytes, digest = entry.get("offset"), entry.get("nbytes"), entry.get("blob")
    if dtype is None:
        raise SnapshotError(f"{source}: tensor {name!r} has unknown dtype {entry.get('dtype')!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_count(d) and d < 2**62 for d in shape)):
        raise SnapshotError(f"{source}: tensor {name!r} has a malformed shape")
    if not (_is_count(offset) and _is_count(nbytes)) or digest not in blobs:
        raise SnapshotError(f"{source}: tensor {name!r} points at no valid blob range")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if math.prod(shape) * itemsize != nbytes:
        raise SnapshotError(f"{source}: tensor {name!r} declares {nbytes} bytes for shape {shape}")
    if offset % itemsize or offset + nbytes > blobs[digest]["size"]:
        raise SnapshotError(f"{source}: tensor {name!r} lies outside its blob {digest[:12]}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tensors_from_blob(
    manifest: dict, digest: str, data: torch.Tensor, names: Iterable[str]
) -> dict[str, torch.Tensor]:
    """Views into a verified blob's bytes for the named tensors (checked by parse_manifest)."""
    out = {}
    for name in names:
        entry = manifest["tensors"][name]
        dtype = DTYPES[entry["dtype"]]
        raw = data[entry["offset"] : entry["offset"] + entry["nbytes"]]
        out[name] = raw.view(dtype).reshape(entry["shape"]) if entry["nbytes"] else torch.empty(
            entry["shape"], dtype=dtype
        )
    return out

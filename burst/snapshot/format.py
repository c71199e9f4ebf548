"""Snapshot format v1: a JSON manifest plus content-addressed blobs of raw tensor bytes.

A manifest names every tensor with its blob, byte offset, dtype and shape. A blob's name
is the SHA-256 of its bytes, so a tensor that did not change since the last snapshot (a
frozen embedding, say) lands in a blob that already exists and is not written again.
Tensors under ``PACK_THRESHOLD`` bytes are packed together so a model with thousands of
small biases does not become thousands of objects.

Nothing here unpickles, and nothing here needs torch: listing, showing, verifying and
moving snapshots run on a machine without it (a laptop, a CI box). Reading a snapshot
parses JSON and checks every declared size against every other before allocating; the
torch side (laying tensors out into blobs, building them back) is
:mod:`burst.snapshot.tensors`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterable
from typing import Any

from burst.errors import SnapshotError

FORMAT_VERSION = 1
PACK_THRESHOLD = 1 << 20  # tensors smaller than this share a pack blob
PACK_LIMIT = 64 << 20  # a pack blob is closed once it reaches this size
ALIGN = 64  # every tensor starts at a multiple of this within its blob
MAX_MANIFEST_BYTES = 256 << 20  # far above any real manifest; a bigger one is hostile
MAX_DIMS = 64  # torch allows at most 64 dimensions
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

# Bytes per element of every dtype the format names (torch's spelling, without "torch.").
# Part of the format, not of the torch at hand: a snapshot is checked the same everywhere.
ITEMSIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


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


def sha256(data: memoryview | bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    dtype = entry.get("dtype")
    itemsize = ITEMSIZES.get(dtype) if isinstance(dtype, str) else None
    shape = entry.get("shape")
    offset, nbytes, digest = entry.get("offset"), entry.get("nbytes"), entry.get("blob")
    if itemsize is None:
        raise SnapshotError(f"{source}: tensor {name!r} has unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_count(d) and d < 2**62 for d in shape)):
        raise SnapshotError(f"{source}: tensor {name!r} has a malformed shape")
    if not (_is_count(offset) and _is_count(nbytes)) or digest not in blobs:
        raise SnapshotError(f"{source}: tensor {name!r} points at no valid blob range")
    if math.prod(shape) * itemsize != nbytes:
        raise SnapshotError(f"{source}: tensor {name!r} declares {nbytes} bytes for shape {shape}")
    if offset % itemsize or offset + nbytes > blobs[digest]["size"]:
        raise SnapshotError(f"{source}: tensor {name!r} lies outside its blob {digest[:12]}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

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
# Manifest caps, sized from the largest state one v1 manifest (one node's host RAM) holds:
# a mixture-of-experts model with unfused experts such as Qwen3-30B-A3B has ~19k parameter
# tensors, and AdamW adds exp_avg, exp_avg_sq and step to each: ~76k tensor entries at
# ~350 manifest bytes apiece (index + state tree), ~27 MB. The caps leave ~2.5x room above
# that; a manifest beyond them is hostile or broken, and parsing one costs time and memory
# in every command that lists the run (a 144 MiB one: 1.1 GB and 25 s), so it is refused
# before it is read (by its size) and before its entries are walked (by their count).
MAX_MANIFEST_BYTES = 64 << 20
MAX_MANIFEST_ENTRIES = 200_000  # tensors, and blobs, each
# Steps are below 10**12 (a trillion optimizer steps: 31 years at 1000 steps a second), so
# a manifest's name is always exactly 12 digits and one step has exactly one name.
MAX_STEP = 10**12
STEP_DIGITS = 12
MAX_DIMS = 64  # torch allows at most 64 dimensions
# fullmatch only: "$" would also accept a trailing newline (a digest that names no blob)
_DIGEST = re.compile(r"[0-9a-f]{64}")
_MANIFEST_NAME = re.compile(rf"([0-9]{{{STEP_DIGITS}}})\.json")

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
    return f"{run_id}/snapshots/{check_step(step)}.json"


def marker_key(run_id: str, step: int) -> str:
    """A write in progress: the blobs it will reference, kept from GC until it commits."""
    return f"{run_id}/uploads/{check_step(step)}.json"


def check_step(step: object) -> str:
    """``step`` as its fixed-width name; refuse anything but an int in [0, MAX_STEP)."""
    if not _is_count(step) or step >= MAX_STEP:  # type: ignore[operator]
        raise SnapshotError(f"step {step!r} is not a step number (0 <= step < {MAX_STEP})")
    return f"{step:0{STEP_DIGITS}d}"


def encode_marker(digests: Iterable[str]) -> bytes:
    return json.dumps({"time": time.time(), "blobs": sorted(digests)}).encode()


def step_of_manifest_key(key: str) -> int | None:
    """The step a manifest's name gives, or None for any name :func:`manifest_key` would
    not write (``99999999999999999999999.json``, ``7.json``, Unicode digits): listing such
    a name would show a step that reading it back cannot find, or one step twice."""
    match = _MANIFEST_NAME.fullmatch(key.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def sha256(data: memoryview | bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """Compact JSON: ``indent`` forces Python's pure-Python encoder, about ten times slower
    (26 ms a manifest for a small Transformer, paid at every persist); ``burst show``
    pretty-prints for people."""
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True,
                      allow_nan=False).encode()


def parse_manifest(data: bytes, *, run_id: str | None = None, step: int | None = None,
                   source: str = "manifest") -> dict:
    """Parse and validate a manifest; every later size check relies on what this accepts.

    ``run_id`` and ``step`` are what the manifest's key says; its content must agree, so
    a manifest copied or renamed under another step is refused, not listed twice.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{source} is {len(data)} bytes: too big to be a manifest "
                            f"(at most {MAX_MANIFEST_BYTES >> 20} MiB)")
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
    if not _is_count(manifest["step"]) or manifest["step"] >= MAX_STEP:
        raise SnapshotError(f"{source} has step {manifest['step']!r}, not a step number "
                            f"(0 <= step < {MAX_STEP})")
    if step is not None and manifest["step"] != step:
        raise SnapshotError(f"{source} holds step {manifest['step']}, not the step its name "
                            "says")
    for field in ("tensors", "blobs"):
        if len(manifest[field]) > MAX_MANIFEST_ENTRIES:
            raise SnapshotError(f"{source} lists {len(manifest[field])} {field}: more than any "
                                f"real model (at most {MAX_MANIFEST_ENTRIES})")
    _check_blobs(manifest["blobs"], source)
    for name, entry in manifest["tensors"].items():
        _check_tensor_entry(name, entry, manifest["blobs"], source)
    return manifest


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_blobs(blobs: dict, source: str) -> None:
    for digest, info in blobs.items():
        if not _DIGEST.fullmatch(digest):
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

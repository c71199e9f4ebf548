"""Snapshot format: a JSON manifest plus content-addressed blobs of raw tensor bytes.

A manifest names every tensor with its dtype and shape and where its bytes lie. A blob's
name is the hash of its bytes, so a tensor that did not change since the last snapshot
(a frozen embedding, say) lands in a blob that already exists and is not written again.
Tensors under ``PACK_THRESHOLD`` bytes are packed together so a model with thousands of
small biases does not become thousands of objects.

Format 1 (what a single process writes; format 3 since BLAKE3, below): each
``tensors`` entry is *whole*, ``{"blob", "offset", "nbytes", "dtype", "shape"}``: the
tensor's C-contiguous bytes at ``offset`` in one blob.

Format 2 (written by every rank of a multi-rank run at once; format 4 since BLAKE3)
keeps the same top-level fields and adds a second kind of entry, *sharded*:
``{"dtype", "shape": [global dims], "shards": [{"offsets", "sizes", "blob", "offset",
"nbytes"}, ...]}``. Each shard is a box of the global tensor (``offsets``/``sizes`` per
dimension) stored C-contiguous in its blob; the boxes never overlap and together cover the
tensor, so any rank can read any region by ranged reads, whatever the world size that wrote
it. Whole entries stay valid in format 2 (a replicated tensor written by one rank). A blob's
``blobs`` record is ``{"size"}`` plus, optionally (format 2 writers add it to blobs larger
than ``CHUNK_BYTES``), ``"chunks"``: the digest of each ``CHUNK_BYTES`` piece, so part of
a blob can be read and verified without reading all of it. A blob without chunks is read
whole and checked against its name.

The hash (``HASHES``): snapshots written before format 3 name and check every blob and
chunk by SHA-256; formats 3 and 4 (``FORMAT_VERSION``, ``SHARDED_FORMAT_VERSION``: the
layouts of 1 and 2) record it in the manifest's ``"hash"`` field, BLAKE3 for what burst
writes now (``WRITE_HASH``): 3.8x SHA-256's speed on one core and tree-hashed across all of
them (scripts/bench_hash.py), so verifying a restore costs little more than reading it.
The version moved with the hash so an older burst refuses such a snapshot by its format
("upgrade burst") instead of taking every blob for corrupt and falling back to an older
step. Writers call :func:`digest` with ``WRITE_HASH``; readers with :func:`hash_of` the
manifest they read.

Nothing here unpickles, and nothing here needs torch: listing, showing, verifying and
moving snapshots run on a machine without it (a laptop, a CI box). Reading a snapshot
parses JSON and checks every declared size against every other before allocating; the
torch side (laying tensors out into blobs, building them back, reading regions) is
:mod:`burst.snapshot.tensors` and :mod:`burst.snapshot.shards`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import blake3

from burst.errors import SnapshotError

SHA256, BLAKE3 = "sha256", "blake3"
HASHES = (SHA256, BLAKE3)
WRITE_HASH = BLAKE3  # what new snapshots are named and checked by
LEGACY_FORMAT_VERSION = 1  # whole, SHA-256 (no "hash" field)
LEGACY_SHARDED_FORMAT_VERSION = 2  # sharded, SHA-256 (no "hash" field)
FORMAT_VERSION = 3  # whole snapshots (one writer): format 1's layout, the hash recorded
SHARDED_FORMAT_VERSION = 4  # every rank writes its own shards: format 2's, the hash recorded
SHARDED_VERSIONS = (LEGACY_SHARDED_FORMAT_VERSION, SHARDED_FORMAT_VERSION)
READABLE_VERSIONS = (LEGACY_FORMAT_VERSION, LEGACY_SHARDED_FORMAT_VERSION, FORMAT_VERSION,
                     SHARDED_FORMAT_VERSION)
# BLAKE3 splits one digest's work over threads only for inputs this big: below it, thread
# start-up costs more than the second core gives (a 1 MiB pack hashes in ~0.15 ms).
THREADED_HASH_BYTES = 8 << 20
# A ranged read of a blob is verified by the hashes of the pieces of this size it covers:
# big enough that a blob's chunk list stays short (a 1 GB blob: 239 hashes), small enough
# that reading a few rows of a shard costs at most two extra pieces.
CHUNK_BYTES = 4 << 20
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
MAX_MANIFEST_ENTRIES = 200_000  # tensors, blobs, and shards (whole entries count one), each
# JSON objects and arrays in one manifest: a tensor entry is two (itself, its shape), its
# reference in the state tree one, a blob one, and the rest (optimizer groups, RNG states)
# a few hundred; a real manifest at the entry caps holds fewer than this. Parsed, each
# costs 60-200 bytes however few bytes it took in the file (``{}``: three), so a manifest
# of millions of empty objects under the byte cap (57 MiB: 1.5 GB parsed) is counted and
# refused before it is parsed. Containers denser than one per MIN_CONTAINER_BYTES (only
# empty or one-digit ones) are refused at any count past MIN_CONTAINERS_CHECKED.
MAX_MANIFEST_CONTAINERS = 5 * MAX_MANIFEST_ENTRIES
MIN_CONTAINER_BYTES = 4
MIN_CONTAINERS_CHECKED = 1 << 16  # below it, parsed, at most a few MB
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
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


def part_key(run_id: str, step: int, rank: int) -> str:
    """One rank's report of the shards it wrote for ``step`` (format 2), read by rank 0."""
    if not _is_count(rank) or rank >= 10**6:
        raise SnapshotError(f"rank {rank!r} is not a rank number (0 <= rank < 1000000)")
    return f"{parts_prefix(run_id, step)}{rank:06d}.json"


def parts_prefix(run_id: str, step: int) -> str:
    """Where the part reports of ``step`` lie: listing it shows which ranks reported."""
    return f"{run_id}/parts/{check_step(step)}/"


def check_step(step: object) -> str:
    """``step`` as its fixed-width name; refuse anything but an int in [0, MAX_STEP)."""
    if not _is_count(step) or step >= MAX_STEP:
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


def digest(data: memoryview | bytes | bytearray, algo: str) -> str:
    """The hex digest naming ``data`` under ``algo`` (one of ``HASHES``): what writers
    name blobs by (with ``WRITE_HASH``) and readers check them by (with :func:`hash_of`).
    A big BLAKE3 input is tree-hashed on every core (the GIL is let go), unless the
    calling thread runs at idle priority (the persister, :mod:`burst.snapshot.priority`):
    BLAKE3's worker threads are shared and keep the priority of whoever started them, so
    background hashing stays on its own thread rather than taking the training step's
    cores, and never starts those workers at idle priority for a restore to wait on."""
    if algo == BLAKE3:
        view = memoryview(data)
        threads = (blake3.blake3.AUTO if view.nbytes >= THREADED_HASH_BYTES
                   and not _idle_thread() else 1)
        return blake3.blake3(view, max_threads=threads).hexdigest()
    if algo == SHA256:
        return hashlib.sha256(data).hexdigest()
    raise SnapshotError(f"unknown snapshot hash {algo!r} (this burst knows "
                        f"{', '.join(HASHES)})")


def _idle_thread() -> bool:
    """Whether the calling thread is scheduled ``SCHED_IDLE`` (Linux: per thread)."""
    idle, get = getattr(os, "SCHED_IDLE", None), getattr(os, "sched_getscheduler", None)
    if idle is None or get is None:
        return False
    try:
        return get(0) == idle
    except OSError:
        return False


def new_hasher(algo: str) -> Any:
    """An incremental hasher (``update``, ``hexdigest``) giving :func:`digest`'s result,
    for bytes that arrive in parts (a download)."""
    if algo == BLAKE3:
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    if algo == SHA256:
        return hashlib.sha256()
    raise SnapshotError(f"unknown snapshot hash {algo!r} (this burst knows "
                        f"{', '.join(HASHES)})")


def hash_of(manifest: Mapping[str, Any]) -> str:
    """The hash a parsed manifest's blobs and chunks are named by (absent: SHA-256)."""
    return manifest.get("hash", SHA256)


def format_fields(*, sharded: bool, algo: str = "") -> dict[str, Any]:
    """The ``format`` (and ``hash``) fields of a manifest written with ``algo`` (default
    ``WRITE_HASH``): formats 1 and 2 for SHA-256, as older burst wrote, so such a snapshot
    stays readable by it; 3 and 4, which older burst refuses, for BLAKE3."""
    algo = algo or WRITE_HASH
    if algo == SHA256:
        return {"format": LEGACY_SHARDED_FORMAT_VERSION if sharded else LEGACY_FORMAT_VERSION}
    return {"format": SHARDED_FORMAT_VERSION if sharded else FORMAT_VERSION, "hash": algo}


def chunk_digests(data: memoryview | bytes | bytearray, algo: str) -> list[str]:
    """The digest of each ``CHUNK_BYTES`` piece of ``data`` (the last may be shorter)."""
    view = memoryview(data).cast("B")
    return [digest(view[start : start + CHUNK_BYTES], algo)
            for start in range(0, len(view), CHUNK_BYTES)]


def blob_info(data: memoryview | bytes | bytearray, algo: str) -> dict[str, Any]:
    """A blob's ``blobs`` record for a sharded manifest: its size, plus its chunk hashes
    when it is larger than one chunk (a smaller one is read whole anyway)."""
    size = memoryview(data).nbytes
    if size <= CHUNK_BYTES:
        return {"size": size}
    return {"size": size, "chunks": chunk_digests(data, algo)}


def is_sharded(entry: Mapping[str, Any]) -> bool:
    """Whether a (parsed) ``tensors`` entry lists shards rather than one whole blob range."""
    return "shards" in entry


def entry_nbytes(entry: Mapping[str, Any]) -> int:
    """The bytes of the whole logical tensor an entry describes, sharded or not."""
    if is_sharded(entry):
        return math.prod(entry["shape"]) * ITEMSIZES[entry["dtype"]]
    return int(entry["nbytes"])


def entry_shards(entry: dict) -> list[dict]:
    """An entry's shards; a whole entry is one shard at offsets 0 spanning the shape."""
    if is_sharded(entry):
        return entry["shards"]
    return [{"offsets": [0] * len(entry["shape"]), "sizes": list(entry["shape"]),
             "blob": entry["blob"], "offset": entry["offset"], "nbytes": entry["nbytes"]}]


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
    _check_containers(data, source)
    try:
        manifest = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{source} is not valid JSON ({exc})") from None
    except RecursionError:
        raise SnapshotError(f"{source} is nested too deeply to be a manifest") from None
    if not isinstance(manifest, dict):
        raise SnapshotError(f"{source} is not a JSON object")
    version = manifest.get("format")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise SnapshotError(
            f"{source} has snapshot format {version!r}; this burst reads formats "
            f"{', '.join(map(str, READABLE_VERSIONS))} (upgrade burst to read newer snapshots)"
        )
    for field, kind in (("run_id", str), ("step", int), ("tensors", dict), ("blobs", dict),
                        ("state", dict)):
        if not isinstance(manifest.get(field), kind):
            raise SnapshotError(f"{source} lacks a valid {field!r} field")
    _check_sections(manifest, source)
    _check_hash(manifest, version, source)
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
    _check_tensors(manifest["tensors"], manifest["blobs"], version, source)
    return manifest


def _check_hash(manifest: dict, version: int, source: str) -> None:
    """Formats 3 and 4 name their hash, one this burst knows; 1 and 2 are SHA-256."""
    algo = manifest.get("hash")
    if version in (LEGACY_FORMAT_VERSION, LEGACY_SHARDED_FORMAT_VERSION):
        if "hash" in manifest:
            raise SnapshotError(f"{source} is format {version}, which is SHA-256 throughout, "
                                f"yet names the hash {algo!r}")
    elif algo not in HASHES:
        raise SnapshotError(f"{source} names its blobs by hash {algo!r}; this burst knows "
                            f"{', '.join(HASHES)} (upgrade burst to read it)")


def _check_containers(data: bytes, source: str) -> None:
    """Refuse, before parsing, a manifest with more objects and arrays than a real one.

    Counting ``{`` and ``[`` bytes is a C-speed upper bound; only past a limit are the
    strings taken out (a slower pass, paid by hostile manifests alone) to count the
    containers a parse would build, so braces inside names never refuse a real one."""
    raw = data.count(b"{") + data.count(b"[")
    if not _too_many(raw, len(data)):
        return
    stripped = _JSON_STRING.sub(b"", data)
    count = stripped.count(b"{") + stripped.count(b"[")
    if _too_many(count, len(data)):
        raise SnapshotError(f"{source} holds {count} JSON objects and arrays: more than a "
                            f"snapshot writes (at most {MAX_MANIFEST_CONTAINERS}, never more "
                            f"than one per {MIN_CONTAINER_BYTES} bytes); refused unparsed")


def _too_many(containers: int, size: int) -> bool:
    return containers > MAX_MANIFEST_CONTAINERS or (
        containers > MIN_CONTAINERS_CHECKED and containers * MIN_CONTAINER_BYTES > size)


# Optional sections that status, report and the planner read as objects; the batch
# layout's members are counts they compute with.
SECTIONS = ("batch", "counters", "amp", "intervals", "versions", "memory")
BATCH_COUNTS = ("global", "micro", "accumulation", "world_size")


def _check_sections(manifest: dict, source: str) -> None:
    """Refuse a section of the wrong type here, once, rather than in every reader."""
    for field in SECTIONS:
        if manifest.get(field) is not None and not isinstance(manifest[field], dict):
            raise SnapshotError(f"{source} has a malformed {field!r} field (not an object)")
    batch = manifest.get("batch") or {}
    for name in BATCH_COUNTS:
        value = batch.get(name)
        if value is not None and not (_is_count(value) and value < MAX_STEP):
            raise SnapshotError(f"{source} has a malformed 'batch' field ({name} is "
                                f"{value!r}, not a count)")
    peaks = (manifest.get("memory") or {}).get("peak_bytes_by_micro_batch")
    if peaks is not None and not isinstance(peaks, dict):
        raise SnapshotError(f"{source} has a malformed 'memory' field (its peaks are not an "
                            "object)")
    if manifest.get("time") is not None and not isinstance(manifest["time"], str):
        raise SnapshotError(f"{source} has a malformed 'time' field (not a string)")


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_blobs(blobs: dict, source: str) -> None:
    for digest, info in blobs.items():
        if not _DIGEST.fullmatch(digest):
            raise SnapshotError(f"{source} names a blob {digest!r} that is not a hex digest")
        if not isinstance(info, dict) or not _is_count(info.get("size")):
            raise SnapshotError(f"{source} gives blob {digest[:12]} no valid size")
        if "chunks" in info:
            _check_chunks(digest, info, source)


def _check_chunks(digest: str, info: dict, source: str) -> None:
    chunks = info["chunks"]
    if (not isinstance(chunks, list) or len(chunks) != -(-info["size"] // CHUNK_BYTES)
            or not all(isinstance(c, str) and _DIGEST.fullmatch(c) for c in chunks)):
        raise SnapshotError(f"{source} gives blob {digest[:12]} malformed chunk hashes "
                            f"(one digest per {CHUNK_BYTES >> 20} MiB piece)")


def _check_tensors(tensors: dict, blobs: dict, version: int, source: str) -> None:
    """Every entry, whole or sharded; shards are counted before each entry's are walked."""
    shards = 0
    for name, entry in tensors.items():
        if not isinstance(entry, dict):
            raise SnapshotError(f"{source}: tensor {name!r} has a malformed entry")
        sharded = "shards" in entry
        if sharded and version not in SHARDED_VERSIONS:
            raise SnapshotError(f"{source}: tensor {name!r} is sharded, which format {version} "
                                "does not allow")
        if sharded and not isinstance(entry["shards"], list):
            raise SnapshotError(f"{source}: tensor {name!r} has a malformed shard list")
        shards += len(entry["shards"]) if sharded else 1
        if shards > MAX_MANIFEST_ENTRIES:
            raise SnapshotError(f"{source} lists more than {MAX_MANIFEST_ENTRIES} tensor shards: "
                                "more than any real model")
        if sharded:
            _check_sharded_entry(name, entry, blobs, source)
        else:
            _check_tensor_entry(name, entry, blobs, source)


def _check_tensor_entry(name: str, entry: dict, blobs: dict, source: str) -> None:
    itemsize, shape = _dtype_and_shape(name, entry, source)
    _check_range(f"tensor {name!r}", entry, shape, itemsize, blobs, source)


def _dtype_and_shape(name: str, entry: dict, source: str) -> tuple[int, list[int]]:
    dtype = entry.get("dtype")
    itemsize = ITEMSIZES.get(dtype) if isinstance(dtype, str) else None
    shape = entry.get("shape")
    if itemsize is None:
        raise SnapshotError(f"{source}: tensor {name!r} has unknown dtype {dtype!r}")
    if not _is_dims(shape):
        raise SnapshotError(f"{source}: tensor {name!r} has a malformed shape")
    return itemsize, shape


def _is_dims(dims: Any) -> TypeGuard[list[int]]:
    return (isinstance(dims, list) and len(dims) <= MAX_DIMS
            and all(_is_count(d) and d < 2**62 for d in dims))


def _check_range(what: str, entry: dict, shape: list[int], itemsize: int, blobs: dict,
                 source: str) -> None:
    """``entry`` holds exactly ``shape`` at an aligned range inside a listed blob."""
    offset, nbytes, digest = entry.get("offset"), entry.get("nbytes"), entry.get("blob")
    if not (_is_count(offset) and _is_count(nbytes)) or not isinstance(digest, str) \
            or digest not in blobs:
        raise SnapshotError(f"{source}: {what} points at no valid blob range")
    if math.prod(shape) * itemsize != nbytes:
        raise SnapshotError(f"{source}: {what} declares {nbytes} bytes for shape {shape}")
    if offset % itemsize or offset + nbytes > blobs[digest]["size"]:
        raise SnapshotError(f"{source}: {what} lies outside its blob {digest[:12]}")


def _check_sharded_entry(name: str, entry: dict, blobs: dict, source: str) -> None:
    """Every shard a box inside the shape, stored in a listed blob; the boxes do not
    overlap and their volumes add up to the tensor's, so together they cover it exactly."""
    itemsize, shape = _dtype_and_shape(name, entry, source)
    volume = 0
    for index, shard in enumerate(entry["shards"]):
        what = f"tensor {name!r} shard {index}"
        if not isinstance(shard, dict):
            raise SnapshotError(f"{source}: {what} is malformed")
        offsets, sizes = shard.get("offsets"), shard.get("sizes")
        if not (_is_dims(offsets) and _is_dims(sizes) and len(offsets) == len(shape)
                and len(sizes) == len(shape)):
            raise SnapshotError(f"{source}: {what} has malformed offsets or sizes")
        if any(o + n > d for o, n, d in zip(offsets, sizes, shape, strict=True)):
            raise SnapshotError(f"{source}: {what} lies outside the tensor's shape {shape}")
        _check_range(what, shard, sizes, itemsize, blobs, source)
        volume += math.prod(sizes)
    if volume != math.prod(shape):
        raise SnapshotError(f"{source}: the shards of tensor {name!r} hold {volume} elements, "
                            f"its shape {shape} has {math.prod(shape)}")
    overlap = _overlapping(entry["shards"])
    if overlap is not None:
        raise SnapshotError(f"{source}: shards {overlap[0]} and {overlap[1]} of tensor "
                            f"{name!r} overlap")


def _overlapping(shards: list[dict]) -> tuple[int, int] | None:
    """Two shards whose boxes share an element, or None. A sweep along dimension 0: only
    shards whose row spans meet are compared, so shards split by rows (the usual FSDP
    layout) cost a sort, and a split along other dimensions compares within a row span."""
    order = sorted((i for i, s in enumerate(shards) if math.prod(s["sizes"]) and s["sizes"]),
                   key=lambda i: shards[i]["offsets"][0])
    active: list[int] = []
    for i in order:
        box = shards[i]
        start = box["offsets"][0]
        active = [j for j in active if shards[j]["offsets"][0] + shards[j]["sizes"][0] > start]
        for j in active:
            if _boxes_meet(box, shards[j]):
                return min(i, j), max(i, j)
        active.append(i)
    return None


def _boxes_meet(a: dict, b: dict) -> bool:
    return all(ao < bo + bn and bo < ao + an for ao, an, bo, bn
               in zip(a["offsets"], a["sizes"], b["offsets"], b["sizes"], strict=True))


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

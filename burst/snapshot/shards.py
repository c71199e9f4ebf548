"""Reading any box of a snapshot's tensor, whatever layout wrote it (format 2 and 1).

A rank restoring onto a different world size needs a region of each tensor: its own rows
(and, under tensor parallelism, columns) of the global tensor. The manifest lists the boxes
(shards) that cover each tensor (:func:`burst.snapshot.format.entry_shards`; a whole v1
entry is one box); :func:`read_region` reads from each shard that meets the region only
the rows of it the region spans, by a ranged read of the shard's blob, and copies the
part of those rows the region wants into a fresh tensor. Nothing else of the tensor is
read or held.

Every byte is verified before it is used. A blob with chunk hashes is read from the first
to the last ``CHUNK_BYTES`` piece the rows touch and each piece is checked; a blob without
them (a v1 blob, a small pack) is read whole and checked against its name. A whole blob,
or the chunk or two a small tensor lies in, is kept in a :class:`BlobCache` for the next
tensor packed beside it.

Staging memory: at most ``WORKERS`` row spans at a time (each no more than one shard's
bytes, plus up to two chunks of widening), plus the cache's ``limit`` (``CACHE_BYTES``).
A blob without chunk hashes is the exception: it is read whole, however big (a v1 blob of
one large tensor), since only its whole can be verified.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from burst.errors import SnapshotError
from burst.snapshot import damaged, reader
from burst.snapshot import format as fmt
from burst.store.base import Store

WORKERS = 4  # shards of one region read at once (ranged reads wait on the network)
CACHE_BYTES = 2 * fmt.PACK_LIMIT  # whole blobs kept: a couple of packs of small tensors
SMALL_CHUNKS = 2  # a span within this many chunks is read chunk by chunk, and they are kept
# A region smaller than this copies its shards on the calling thread: its bytes come from
# cached packs or a chunk or two, and starting a pool per tensor would cost a reshard of
# 200k small tensors minutes (tests/snapshot/test_index_scale.py).
SERIAL_BYTES = fmt.PACK_THRESHOLD


class BlobCache:
    """Verified bytes of blobs and chunks, for the regions read after the one that read them.

    Blobs without chunk hashes are read whole, and many small tensors share one such pack;
    a small tensor in a big pack with chunk hashes costs the chunk around it. Either is
    kept (least recently used out first, at most ``limit`` bytes) rather than read and
    hashed again for the next tensor in it. ``kept`` (digest -> a verified buffer, e.g.
    what a pull left in memory) is used as is and never evicted. ``check_hash=False``
    only for a store this process has just verified (its own local tier): sizes are still
    checked. One cache per restore, shared by its threads; drop it when done."""

    def __init__(self, limit: int = CACHE_BYTES, *, kept: Mapping[str, Any] | None = None,
                 check_hash: bool = True) -> None:
        self.limit = limit
        self.check_hash = check_hash
        self._kept = dict(kept or {})
        self._lru: OrderedDict[tuple[str, int], Any] = OrderedDict()  # (digest, chunk or -1)
        self._held = 0
        self._lock = threading.Lock()

    def known(self, digest: str) -> Any | None:
        """The verified buffer of the whole blob ``digest`` if this cache has it, else None."""
        with self._lock:
            if digest in self._kept:
                return self._kept[digest]
        return self._get((digest, -1))

    def whole(self, store: Store, run_id: str, digest: str, size: int, algo: str) -> Any:
        """The blob's verified bytes, from the cache or read (and kept if it fits)."""
        data = self.known(digest)
        if data is None:
            data = reader.read_blob(store, run_id, digest, size, algo=algo,
                                    check_hash=self.check_hash)
            self._put((digest, -1), data, size)
        return data

    def chunk(self, store: Store, run_id: str, digest: str, info: dict, index: int,
              algo: str) -> Any:
        """Chunk ``index`` of a blob with chunk hashes, verified, from the cache or read."""
        data = self._get((digest, index))
        if data is None:
            begin = index * fmt.CHUNK_BYTES
            length = min(fmt.CHUNK_BYTES, info["size"] - begin)
            data = read_verified(store, run_id, digest, info, begin, length, algo=algo,
                                 check_hash=self.check_hash)
            self._put((digest, index), data, length)
        return data

    def _get(self, key: tuple[str, int]) -> Any | None:
        with self._lock:
            data = self._lru.get(key)
            if data is not None:
                self._lru.move_to_end(key)
            return data

    def _put(self, key: tuple[str, int], data: Any, size: int) -> None:
        if size > self.limit:
            return
        with self._lock:
            if key in self._lru:
                return
            self._lru[key] = data
            self._held += size
            while self._held > self.limit:
                _, old = self._lru.popitem(last=False)
                self._held -= memoryview(old).nbytes


def read_whole(store: Store, manifest: dict, name: str, *,
               blobs: BlobCache | None = None) -> torch.Tensor:
    """The whole logical tensor ``name``, assembled from its shards."""
    shape = manifest["tensors"][name]["shape"]
    return read_region(store, manifest, name, [0] * len(shape), list(shape), blobs=blobs)


def read_region(store: Store, manifest: dict, name: str, offsets: Sequence[int],
                sizes: Sequence[int], *, blobs: BlobCache | None = None) -> torch.Tensor:
    """A new contiguous CPU tensor of ``sizes`` holding the box at ``offsets`` of the
    tensor ``name`` of a parsed manifest, whole or sharded alike.

    Raises ``ValueError`` for a box outside the tensor and
    :class:`~burst.errors.SnapshotError` when a blob is missing or its bytes do not match
    their hashes, or when the shards leave part of the box uncovered. Pass one
    :class:`BlobCache` to every call of a restore (blobs without chunk hashes are then
    read once, not once per tensor)."""
    entry = manifest["tensors"][name]
    shape = list(entry["shape"])
    box = _Box(list(offsets), list(sizes))
    if not box.inside(shape):
        raise ValueError(f"region offsets {list(offsets)} sizes {list(sizes)} is not inside "
                         f"tensor {name!r} of shape {shape}")
    itemsize = fmt.ITEMSIZES[entry["dtype"]]
    dtype = _torch_dtype(entry["dtype"])
    try:
        raw = torch.empty(math.prod(box.sizes) * itemsize, dtype=torch.uint8)
    except (MemoryError, RuntimeError):  # a hostile manifest's shape, or too big here
        raise SnapshotError(f"tensor {name!r} region {box.sizes} needs "
                            f"{math.prod(box.sizes) * itemsize} bytes of memory, more than "
                            "this machine can allocate") from None
    if raw.numel():
        staged = raw.numpy().reshape([*box.sizes, itemsize] if shape else [1, itemsize])
        cache = blobs if blobs is not None else BlobCache()
        pieces = _pieces(fmt.entry_shards(entry), box)
        if sum(math.prod(p.sizes) for _, p in pieces) != math.prod(box.sizes):
            raise SnapshotError(f"the shards of tensor {name!r} in snapshot "
                                f"{manifest['run_id']}@{manifest['step']} leave part of "
                                f"region {box.offsets}+{box.sizes} uncovered")
        copy = _Copier(store, manifest, cache, itemsize, box, staged)
        if len(pieces) == 1 or raw.numel() < SERIAL_BYTES:  # a pool costs more than it saves
            for piece in pieces:
                copy(piece)
        else:
            with ThreadPoolExecutor(min(WORKERS, len(pieces)),
                                    thread_name_prefix="burst-shards") as pool:
                list(pool.map(copy, pieces))
    return raw.view(dtype).reshape(box.sizes)


class _Box:
    """Offsets and sizes per dimension (a 0-d tensor is one box of no dimensions)."""

    def __init__(self, offsets: list[int], sizes: list[int]) -> None:
        self.offsets, self.sizes = offsets, sizes

    def inside(self, shape: list[int]) -> bool:
        if len(self.offsets) != len(shape) or len(self.sizes) != len(shape):
            return False
        return all(o >= 0 and n >= 0 and o + n <= d
                   for o, n, d in zip(self.offsets, self.sizes, shape, strict=True))


def _pieces(shards: list[dict], box: _Box) -> list[tuple[dict, _Box]]:
    """Each shard that meets ``box``, with the intersection (in global coordinates)."""
    out = []
    for shard in shards:
        lo = [max(a, b) for a, b in zip(shard["offsets"], box.offsets, strict=True)]
        hi = [min(a + n, b + m) for a, n, b, m
              in zip(shard["offsets"], shard["sizes"], box.offsets, box.sizes,
                     strict=True)]
        if all(h > low for low, h in zip(lo, hi, strict=True)):
            out.append((shard, _Box(lo, [h - low for low, h in zip(lo, hi, strict=True)])))
    return out


class _Copier:
    """Reads one shard's rows of the region and copies the region's part into ``staged``."""

    def __init__(self, store: Store, manifest: dict, cache: BlobCache, itemsize: int,
                 box: _Box, staged: np.ndarray) -> None:
        self.store, self.manifest, self.cache = store, manifest, cache
        self.itemsize, self.box, self.staged = itemsize, box, staged

    def __call__(self, piece: tuple[dict, _Box]) -> None:
        shard, part = piece
        ss, so = shard["sizes"], shard["offsets"]
        if not ss:  # a 0-d tensor: its one element
            data = self._bytes(shard["blob"], shard["offset"], self.itemsize)
            self.staged[...] = np.frombuffer(data, np.uint8, self.itemsize).reshape(1, -1)
            return
        row = math.prod(ss[1:]) * self.itemsize
        first, rows = part.offsets[0] - so[0], part.sizes[0]
        data = self._bytes(shard["blob"], shard["offset"] + first * row, rows * row)
        src = np.frombuffer(data, np.uint8, rows * row).reshape([rows, *ss[1:], self.itemsize])
        src_at = (slice(None), *(slice(o - s, o - s + n) for o, s, n
                                 in zip(part.offsets[1:], so[1:], part.sizes[1:], strict=True)))
        dst_at = tuple(slice(o - b, o - b + n)
                       for o, b, n in zip(part.offsets, self.box.offsets, part.sizes,
                                          strict=True))
        self.staged[dst_at] = src[src_at]

    def _bytes(self, digest: str, start: int, length: int) -> memoryview:
        """Bytes ``start..start+length`` of a blob, verified (see the module's docstring)."""
        run_id, algo = self.manifest["run_id"], fmt.hash_of(self.manifest)
        info = self.manifest["blobs"][digest]
        known = self.cache.known(digest)
        if known is None and "chunks" not in info:
            known = self.cache.whole(self.store, run_id, digest, info["size"], algo)
        if known is not None:
            return memoryview(known).cast("B")[start : start + length]
        first, last = _chunks_of(start, length)
        if last - first >= SMALL_CHUNKS:  # a long span: one ranged read, nothing kept
            return read_verified(self.store, run_id, digest, info, start, length, algo=algo,
                                 check_hash=self.cache.check_hash)
        pieces = [self.cache.chunk(self.store, run_id, digest, info, k, algo)
                  for k in range(first, last + 1)]
        data = memoryview(pieces[0] if len(pieces) == 1 else b"".join(pieces)).cast("B")
        skip = start - first * fmt.CHUNK_BYTES
        return data[skip : skip + length]


def read_verified(store: Store, run_id: str, digest: str, info: dict, start: int,
                  length: int, *, algo: str, check_hash: bool = True) -> memoryview:
    """Bytes ``start..start+length`` of a blob with chunk hashes: the chunks they touch
    are read in one ranged read and each is checked against its hash."""
    size, chunk = info["size"], fmt.CHUNK_BYTES
    first, last = _chunks_of(start, length)
    begin, end = first * chunk, min((last + 1) * chunk, size)
    try:
        data = memoryview(store.read_range(fmt.blob_key(run_id, digest), begin,
                                           end - begin)).cast("B")
    except KeyError:
        raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is missing from the "
                            "store") from None
    for index in range(first, last + 1) if check_hash else ():
        piece = data[index * chunk - begin : min((index + 1) * chunk, size) - begin]
        if fmt.digest(piece, algo) != info["chunks"][index]:
            damaged.condemn(store, run_id, digest, algo)  # the next snapshot writes it again
            raise SnapshotError(f"blob {digest[:12]} of run {run_id!r} is corrupt: chunk "
                                f"{index} does not match its hash")
    return data[start - begin : start - begin + length]


def _chunks_of(start: int, length: int) -> tuple[int, int]:
    """The first and last chunk a byte range touches (an empty range: its start's)."""
    return start // fmt.CHUNK_BYTES, max(start + length - 1, start) // fmt.CHUNK_BYTES


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SnapshotError(f"this torch ({torch.__version__}) has no dtype {name} "
                            "(upgrade torch to restore it)")
    return dtype

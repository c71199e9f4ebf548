"""Sharded snapshots (format 2): every rank writes its own part, rank 0 commits the whole.

On several ranks no rank holds the whole state, so no rank can write a snapshot alone.
Each rank's persister instead writes a *part* straight into the run's store
(:func:`write_part`):

1. lay its tensors out into blobs (small ones packed, as a whole snapshot does), hash them
   (plus one hash per ``CHUNK_BYTES`` piece of a blob larger than that, so a restoring
   rank can verify a ranged read of part of it);
2. write an upload marker ``uploads/<step>.r<rank>.json`` naming those blobs, so a GC
   running meanwhile keeps them (:mod:`burst.snapshot.retention` reads every marker);
3. write every blob the store lacks and check the size each landed with;
4. put its *part report* at :func:`burst.snapshot.format.part_key`: the blobs and, for
   each tensor, the box of the global tensor it wrote (a sharded entry with one shard).

Rank 0 then waits for every rank's report of that step and merges them into one format 2
manifest (:func:`commit_parts`), committed by :func:`burst.snapshot.commit.commit` like
any other snapshot: the manifest is written last, so the snapshot is complete or invisible.
Rank 0's persister hands its own report to the commit in memory (``publish=False``,
``own=``) rather than through the store: storing it and reading it back cost the commit a
synced write, a listing and a read on its critical path, and only rank 0 reads reports.
A rank that dies mid-way leaves no report; rank 0 waits until ``timeout`` and gives up,
and the previous snapshot stays the newest. The parts and markers of a committed step are
deleted by the next commit of a later step (a step persisted again, such as the final
snapshot at the step of a periodic one, finds its parts still there; a crash leaves them;
they are small).

Each rank's persister coalesces queued snapshots on its own, so a rank may skip a step
another rank wrote. A rank that reported a newer step but not this one has skipped it, so
rank 0 gives this step up at once (no manifest, no error) instead of waiting for the
timeout. Reports carry a ``launch`` id, when the ranks agreed on one, so the parts a crashed
earlier launch left behind at later steps are never taken for this launch's.

The blob dedup race is the one :mod:`burst.snapshot.commit` describes: a rank that finds a
blob already there skips it, and a GC that listed the blobs before that rank's marker was
written may delete it. Rank 0 checks every blob's size before writing the manifest; a blob
that is gone then fails the step (naming the rank that reported it), since rank 0 has no
copy to write again.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from burst import killpoints
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import index, reader
from burst.snapshot import tree as tree_mod
from burst.snapshot.commit import commit, each_blob
from burst.snapshot.tensors import dtype_name, layout_blobs
from burst.store.base import Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry

_POOL_BYTES = 16 << 20  # hash a part this small on the persister thread alone
_WORKERS = 4
_POLL_MAX = 0.5  # seconds between listings while waiting for the other ranks, at most
_PART = re.compile(r"([0-9]{12})/([0-9]{6})\.json")
_RANK_MARKER = re.compile(r"([0-9]{12})\.r([0-9]+)\.json")


class Box(NamedTuple):
    """Where a rank's piece of a tensor lies in the global tensor: the global shape and the
    piece's offset along each dimension (its sizes are the piece's own shape)."""

    shape: tuple[int, ...]
    offsets: tuple[int, ...]

    @classmethod
    def whole(cls, tensor: torch.Tensor) -> Box:
        return cls(tuple(tensor.shape), (0,) * tensor.dim())


def rank_marker_key(run_id: str, step: int, rank: int) -> str:
    """One rank's upload marker for ``step``: its blobs, protected from GC until the commit."""
    return f"{run_id}/uploads/{fmt.check_step(step)}.r{rank}.json"


def write_part(store: Store, run_id: str, step: int, rank: int,
               tensors: dict[str, torch.Tensor], boxes: Mapping[str, Box], *,
               world_size: int, launch: str | None = None,
               policy: RetryPolicy = DEFAULT_RETRY, publish: bool = True) -> dict:
    """Write this rank's blobs of ``step`` into ``store`` and then its part report; return
    the report. ``tensors`` are contiguous host tensors, ``boxes`` their places.
    ``publish=False`` (rank 0, which commits): the report is returned, not stored; pass it
    to :func:`commit_parts` as ``own``."""
    missing = [name for name in tensors if name not in boxes]
    if missing:
        raise SnapshotError(f"rank {rank} has no box for tensor {missing[0]!r}")
    blobs = layout_blobs(tensors)
    payloads = [blob.payload(tensors) for blob in blobs]
    algo = fmt.WRITE_HASH
    with _workers(payloads) as pool:
        infos = _hash(payloads, algo, pool)
        digests = [digest for digest, _ in infos]
        retry(lambda: store.put(rank_marker_key(run_id, step, rank),
                                fmt.encode_marker(digests)), policy)
        killpoints.hit("shard.marker-written")
        payload_of = dict(zip(digests, payloads, strict=True))
        each_blob(lambda digest: _land(store, run_id, digest, payload_of[digest], policy),
                  sorted(payload_of, key=lambda d: len(payload_of[d]), reverse=True), pool)
    killpoints.hit("shard.blobs-written")
    entries: dict[str, dict] = {}
    for blob, (digest, _) in zip(blobs, infos, strict=True):
        for name, offset in zip(blob.names, blob.offsets, strict=True):
            entries[name] = _shard_entry(tensors[name], boxes[name], digest, offset)
    report = {**fmt.format_fields(sharded=True, algo=algo), "run_id": run_id, "step": step,
              "rank": rank, "world_size": world_size, "launch": launch,
              "blobs": dict(infos), "tensors": entries}
    if publish:
        retry(lambda: store.put(fmt.part_key(run_id, step, rank), _encode(report)), policy)
    killpoints.hit("shard.part-written")
    return report


@contextmanager
def _workers(payloads: list[memoryview]) -> Iterator[ThreadPoolExecutor | None]:
    """One set of threads for hashing a big part and then landing its blobs (none for a
    small part). Threads started from the idle-priority persister wait to be first
    scheduled (:mod:`burst.snapshot.commit` says so too): a second set for the writes
    left a rank's first blob write waiting 0.14 s after its marker on a loaded 2-core
    machine (``scripts/bench_sharded.py``)."""
    if sum(p.nbytes for p in payloads) < _POOL_BYTES:
        yield None
        return
    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="burst-part") as pool:
        yield pool


def _hash(payloads: list[memoryview], algo: str, pool: ThreadPoolExecutor | None
          ) -> list[tuple[str, dict]]:
    """(digest, blob record) per payload; hashing releases the GIL, so big parts use
    ``pool``'s threads."""
    def info(data: memoryview) -> tuple[str, dict]:
        return fmt.digest(data, algo), fmt.blob_info(data, algo)

    if pool is None:
        return [info(p) for p in payloads]
    return list(pool.map(info, payloads))


def _land(store: Store, run_id: str, digest: str, data: memoryview,
          policy: RetryPolicy) -> None:
    """Write one blob unless the store has it already; check the size it landed with."""
    key = fmt.blob_key(run_id, digest)
    if retry(lambda: store.size(key), policy) == data.nbytes:
        return
    killpoints.hit("shard.blob")
    retry(lambda: store.put(key, data), policy)
    landed = retry(lambda: store.size(key), policy)
    if landed != data.nbytes:
        raise SnapshotError(f"blob {digest[:12]} landed in {store.url} as {landed} bytes, "
                            f"wrote {data.nbytes}")


def _shard_entry(tensor: torch.Tensor, box: Box, digest: str, offset: int) -> dict:
    sizes = list(tensor.shape)
    if len(box.shape) != len(sizes) or len(box.offsets) != len(sizes):
        raise SnapshotError(f"a box of {len(box.shape)} dimensions for a tensor of {len(sizes)}")
    shard = {"offsets": list(box.offsets), "sizes": sizes, "blob": digest, "offset": offset,
             "nbytes": tensor.numel() * tensor.element_size()}
    return {"dtype": dtype_name(tensor.dtype), "shape": list(box.shape), "shards": [shard]}


def _encode(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


# -- rank 0: waiting for the parts, merging, committing -----------------------------------------


@dataclass
class _Waiting:
    """What rank 0 knows of a step's parts while it waits for them."""

    store: Store
    run_id: str
    step: int
    world_size: int
    launch: str | None
    policy: RetryPolicy
    reports: dict[int, dict] = field(default_factory=dict)  # rank -> its report

    def poll(self) -> bool | None:
        """True when every rank reported, None when a rank skipped the step, else False."""
        keys = retry(lambda: self.store.list(f"{self.run_id}/parts/"), self.policy)
        parts = _parts_by_step(keys, self.run_id)
        for rank in sorted(parts.get(self.step, set()) - self.reports.keys()):
            report = self._read(self.step, rank)
            if report is not None:
                self.reports[rank] = report
        missing = set(range(self.world_size)) - self.reports.keys()
        if not missing:
            return True
        for newer in sorted(s for s in parts if s > self.step):
            for rank in sorted(parts[newer] & missing):
                if self._read(newer, rank) is not None:
                    return None  # that rank coalesced this step into a newer one
        return False

    def _read(self, step: int, rank: int) -> dict | None:
        """A rank's report, or None when it belongs to another launch (or just vanished)."""
        try:
            data = retry(lambda: self.store.get(fmt.part_key(self.run_id, step, rank)),
                         self.policy)
        except KeyError:
            return None
        report = _parse_report(data, self.run_id, step, rank)
        if self.launch is not None and report.get("launch") != self.launch:
            return None
        if report.get("world_size") != self.world_size:
            raise SnapshotError(f"rank {rank} reported step {step} for a world of "
                                f"{report.get('world_size')} ranks, not {self.world_size}")
        return report

    def missing(self) -> list[int]:
        return sorted(set(range(self.world_size)) - self.reports.keys())


def commit_parts(store: Store, run_id: str, step: int, world_size: int, *, tree: dict,
                 meta: Mapping[str, Any], stamp: Mapping[str, Any] | None = None,
                 launch: str | None = None, timeout: float = 300.0, poll: float = 0.01,
                 policy: RetryPolicy = DEFAULT_RETRY, own: dict | None = None) -> dict | None:
    """On rank 0: wait for every rank's part of ``step``, merge them into a format 2
    manifest (``tree`` and ``meta`` are rank 0's, ``stamp`` the lineage fields) and commit
    it; return the manifest. None (nothing committed) when a rank skipped the step;
    :class:`SnapshotError` when a rank has not reported within ``timeout`` seconds.
    ``own``: rank 0's report as :func:`write_part` returned it (``publish=False``), not
    waited for in the store."""
    waiting = _Waiting(store, run_id, step, world_size, launch, policy)
    if own is not None:
        waiting.reports[own["rank"]] = own
    began = time.monotonic()
    deadline = began + timeout
    while True:
        done = waiting.poll()
        if done is None:
            _clean(store, run_id, step, policy, only=True)
            return None
        if done:
            break
        if time.monotonic() >= deadline:
            raise SnapshotError(f"the snapshot of step {step} is incomplete: rank(s) "
                                f"{', '.join(map(str, waiting.missing()))} did not report "
                                f"their part within {timeout:.0f}s")
        # listings grow sparser as the wait goes on, but never by more than an eighth of
        # the time already waited: doubling the delay made rank 0 notice the last part up
        # to as long again after it landed. The first ones come every ``poll``: the last
        # part typically lands within a fraction of a second of rank 0's own, and a 50 ms
        # floor made the commit notice it 25 ms late on average (10 ms: a few listings more)
        time.sleep(min(max(poll, (time.monotonic() - began) / 8), _POLL_MAX))
    killpoints.hit("shard-commit.parts-read")
    algo = _hash_of(waiting)
    tensors, blobs, owner = merge(waiting.reports, world_size)
    waiting.reports.clear()  # merged: rank 0's memory holds one copy of the table
    _check_tree(tree, tensors, step)
    fields = fmt.format_fields(sharded=True, algo=algo)
    files = dict(index.encode_files(fields, run_id, step, tensors, blobs, algo))
    del tensors
    manifest = {**meta, **(stamp or {}), **fields, "run_id": run_id, "step": step,
                "state": tree, "tensors": {}, "indexes": list(files),
                "blobs": {digest: {"size": len(data)} for digest, data in files.items()}}
    data = fmt.encode_manifest(manifest)
    expanded = _expanded(data, files, run_id, step)
    sizes = {digest: info["size"] for digest, info in expanded["blobs"].items()}

    def land(digest: str, _size: int) -> None:
        if digest in files:  # an index file: rank 0's own, written after every rank's blobs
            retry(lambda: store.put(fmt.blob_key(run_id, digest), files[digest]), policy)
            return
        raise SnapshotError(f"blob {digest[:12]} that rank {owner[digest]} wrote for step "
                            f"{step} is missing from {store.url}")

    try:
        commit(store, run_id, step, data, sizes, land, overwrite=True, points="shard-commit",
               policy=policy)
    except SnapshotError:
        _withdraw(store, run_id, step, data, policy)
        raise
    reader.remember_digests(data, run_id, step, frozenset(sizes))
    _clean(store, run_id, step, policy)
    killpoints.hit("shard-commit.parts-deleted")
    return expanded


def _expanded(data: bytes, files: dict[str, bytes], run_id: str, step: int) -> dict:
    """The manifest ``data`` with its index ``files`` merged in, each checked as a reader
    will check it (:func:`burst.snapshot.reader.with_indexes`): what the commit returns."""
    source = f"merged manifest of step {step}"
    parsed = fmt.parse_manifest(data, run_id=run_id, step=step, source=source)
    return index.expand(parsed, [index.parse(files[digest], parsed, digest, source)
                                 for digest in index.listed(parsed, source)])


def _hash_of(waiting: _Waiting) -> str:
    """The one hash every rank named its blobs by (a mix cannot be one manifest)."""
    algos = {fmt.hash_of(report) for report in waiting.reports.values()}
    if len(algos) != 1:
        raise SnapshotError(f"the ranks named the blobs of step {waiting.step} by different "
                            f"hashes ({', '.join(sorted(algos))})")
    return algos.pop()


def _parse_report(data: bytes, run_id: str, step: int, rank: int) -> dict:
    try:
        report = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise SnapshotError(f"rank {rank}'s part of step {step} is not valid JSON") from None
    if (not isinstance(report, dict) or report.get("run_id") != run_id
            or report.get("step") != step or report.get("rank") != rank
            or not isinstance(report.get("blobs"), dict)
            or not isinstance(report.get("tensors"), dict)):
        raise SnapshotError(f"rank {rank}'s part of step {step} is malformed")
    return report


def merge(reports: Mapping[int, dict], world_size: int
          ) -> tuple[dict[str, dict], dict[str, dict], dict[str, int]]:
    """The ranks' parts as a manifest's ``tensors`` and ``blobs``, and the rank that wrote
    each blob. A tensor one rank wrote whole becomes a whole (format 1) entry."""
    blobs: dict[str, dict] = {}
    owner: dict[str, int] = {}
    tensors: dict[str, dict] = {}
    for rank in range(world_size):
        try:
            _merge_one(rank, reports[rank], tensors, blobs, owner)
        except (KeyError, TypeError, AttributeError):
            raise SnapshotError(f"rank {rank}'s part report is malformed") from None
    return {name: _final(name, entry) for name, entry in sorted(tensors.items())}, blobs, owner


def _merge_one(rank: int, report: dict, tensors: dict[str, dict], blobs: dict[str, dict],
               owner: dict[str, int]) -> None:
    for digest, info in report["blobs"].items():
        if digest in blobs and blobs[digest]["size"] != info.get("size"):
            raise SnapshotError(f"ranks {owner[digest]} and {rank} give blob {digest[:12]} "
                                "different sizes")
        blobs.setdefault(digest, info)
        owner.setdefault(digest, rank)
    for name, entry in report["tensors"].items():
        merged = tensors.setdefault(name, {"dtype": entry["dtype"], "shape": entry["shape"],
                                           "shards": []})
        if (merged["dtype"], merged["shape"]) != (entry["dtype"], entry["shape"]):
            raise SnapshotError(f"rank {rank} wrote tensor {name!r} as {entry['dtype']} "
                                f"{entry['shape']}, another rank as {merged['dtype']} "
                                f"{merged['shape']}")
        merged["shards"].extend(entry["shards"])


def _final(name: str, entry: dict) -> dict:
    """Check the shards cover the tensor exactly; one full shard becomes a whole entry."""
    shape = entry["shape"]
    shards = sorted(entry["shards"], key=lambda s: s["offsets"])
    volume = sum(math.prod(s["sizes"]) for s in shards)
    if volume != math.prod(shape):
        raise SnapshotError(f"the ranks' parts hold {volume} elements of tensor {name!r}, "
                            f"its shape {shape} has {math.prod(shape)}")
    if len(shards) == 1 and shards[0]["sizes"] == shape:
        shard = shards[0]
        return {"blob": shard["blob"], "offset": shard["offset"], "nbytes": shard["nbytes"],
                "dtype": entry["dtype"], "shape": shape}
    return {**entry, "shards": shards}


def _check_tree(tree: dict, tensors: dict[str, dict], step: int) -> None:
    """Every tensor the state tree names is in the parts, and nothing else is."""
    named = set(tree_mod.tensor_names(tree))
    lacking = sorted(named - tensors.keys())
    if lacking:
        raise SnapshotError(f"no rank wrote tensor {lacking[0]!r} of step {step}")
    extra = sorted(tensors.keys() - named)
    if extra:
        raise SnapshotError(f"a rank wrote tensor {extra[0]!r} of step {step}, which the "
                            "state does not name")


def _withdraw(store: Store, run_id: str, step: int, data: bytes, policy: RetryPolicy) -> None:
    """Take back a manifest of ours that a failed commit left visible (a blob a GC removed
    after the manifest landed cannot be written again by rank 0)."""
    key = fmt.manifest_key(run_id, step)
    try:
        if retry(lambda: store.get(key), policy) == data:
            retry(lambda: store.delete(key), policy)
    except KeyError:
        pass


def _clean(store: Store, run_id: str, step: int, policy: RetryPolicy, *,
           only: bool = False) -> None:
    """Delete the parts and rank markers of ``step`` (``only``: a step given up) or of
    every step before it (after committing ``step``: no rank still writes an older one,
    since every rank reported this one).

    A committed step's own parts stay until a later commit: a step can be persisted
    again (the final snapshot at the step of a periodic one), and a rank that already
    rewrote its part of it must not see that part deleted under it, or rank 0 would wait
    for it in vain. Both parts of a step hold the same state."""
    def done(other: int) -> bool:
        return other == step if only else other < step

    keys = retry(lambda: store.list(f"{run_id}/parts/"), policy)
    doomed = [f"{run_id}/parts/{m.group(0)}" for m in _matches(keys, f"{run_id}/parts/", _PART)
              if done(int(m.group(1)))]
    uploads = retry(lambda: store.list(f"{run_id}/uploads/"), policy)
    doomed += [f"{run_id}/uploads/{m.group(0)}"
               for m in _matches(uploads, f"{run_id}/uploads/", _RANK_MARKER)
               if done(int(m.group(1)))]
    for key in doomed:
        retry(lambda k=key: store.delete(k), policy)


def _matches(keys: list[str], prefix: str, pattern: re.Pattern) -> list[re.Match]:
    found = (pattern.fullmatch(key[len(prefix):]) for key in keys if key.startswith(prefix))
    return [m for m in found if m is not None]


def _parts_by_step(keys: list[str], run_id: str) -> dict[int, set[int]]:
    """Listing of ``<run>/parts/`` -> {step: ranks that reported it}."""
    parts: dict[int, set[int]] = {}
    for match in _matches(keys, f"{run_id}/parts/", _PART):
        parts.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    return parts

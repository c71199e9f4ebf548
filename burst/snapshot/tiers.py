"""Snapshot tiers: a host-RAM shadow (cheap, every few steps) and a background persister.

The training loop only ever pays for one thing: copying the state's tensors into
preallocated host buffers (the RAM shadow). Hashing, packing and writing to the store
happen on a background thread from that copy (:class:`Tiers` owns both), so the loop keeps
training while a snapshot is made durable.

Two buffer sets let one be persisted while the other takes the next shadow copy; if a
persist is asked for while one is still running, the request is coalesced into the
newest shadow when the thread comes free.

The persister commits through :mod:`burst.snapshot.commit` (blobs first, verified, the
manifest last), so a snapshot is complete or invisible; reading snapshots back is
:mod:`burst.snapshot.reader` (and :mod:`burst.snapshot.tensors` for their tensors).

On several ranks (:meth:`Tiers.shard_into`) each rank's persister writes its own part of
the snapshot into the run's store instead, and rank 0's commits the manifest once every
rank's part is in (:mod:`burst.snapshot.parts`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import torch

from burst.errors import BurstError, SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import parts, priority, retention
from burst.snapshot.commit import commit
from burst.snapshot.reader import list_steps, remember_digests
from burst.snapshot.tensors import Blob, layout_blobs, tensor_entry
from burst.store.base import Store

_POOL_BYTES = 16 << 20  # hash a snapshot this small on the persister thread alone
SWEEP_SECONDS = 3600.0  # a persister sweeps killed writes' temporaries this often
LINGER_SECONDS = 1.0  # an idle persister waits this long for the next write before leaving


@dataclass
class Captured:
    """A consistent copy of the training state at one optimizer-step boundary."""

    step: int
    tree: dict[str, Any]  # JSON tree of the state (tensors referenced by name)
    tensors: dict[str, torch.Tensor]  # host-RAM copies, owned by a shadow buffer set
    meta: dict[str, Any]  # manifest fields: counters, batch layout, amp, reason...
    buffers: ShadowBuffers | None = field(default=None, repr=False)
    # where each tensor lies in its global tensor (this rank's pieces of a sharded
    # snapshot, burst.parallel.pieces); None: the tensors are whole
    boxes: dict[str, parts.Box] | None = field(default=None, repr=False)


class ShadowBuffers:
    """Preallocated host tensors matching the state; reallocated only when the layout changes.

    Tensors the snapshot format packs into one blob (:func:`layout_blobs`: the many small
    ones) share one zeroed host buffer per blob, each tensor a view at its place in it.
    The shadow copy then lands them where the blob has them, and the persister writes the
    blob's bytes as they lie: no second copy and no per-tensor conversion, which on a
    model of hundreds of small tensors cost a persist more than hashing its bytes."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._packs: dict[PackKey, memoryview] = {}

    def copy_from(self, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._matches(live):
            self.tensors, self._packs = _allocate(live)
        needs_sync = False
        for name, tensor in live.items():
            self.tensors[name].copy_(tensor.detach(), non_blocking=tensor.is_cuda)
            needs_sync |= tensor.is_cuda
        if needs_sync:
            torch.cuda.synchronize()
        return self.tensors

    def packed(self, blob: Blob) -> memoryview | None:
        """The bytes of ``blob`` if these buffers hold it as one pack, laid out as it is."""
        return self._packs.get(_pack_key(blob))

    def _matches(self, live: dict[str, torch.Tensor]) -> bool:
        if self.tensors.keys() != live.keys():
            return False
        return all(
            b.shape == t.shape and b.dtype == t.dtype
            for b, t in zip(self.tensors.values(), live.values(), strict=True)
        )


PackKey = tuple[tuple[str, ...], tuple[int, ...], int]  # a blob's names, offsets and size


def _pack_key(blob: Blob) -> PackKey:
    return tuple(blob.names), tuple(blob.offsets), blob.size


def _allocate(live: dict[str, torch.Tensor]
              ) -> tuple[dict[str, torch.Tensor], dict[PackKey, memoryview]]:
    """Host buffers for ``live`` (in its order), the packed ones as views into their
    blob's buffer; and each pack's bytes by the blob it is."""
    placed: dict[str, torch.Tensor] = {}
    packs: dict[PackKey, memoryview] = {}
    for blob in layout_blobs(live):
        if len(blob.names) < 2:
            continue
        members = [live[name] for name in blob.names]
        flat = torch.zeros(blob.size, dtype=torch.uint8, device="cpu",
                           pin_memory=any(t.is_cuda for t in members))
        try:
            views = {name: _view_at(flat, offset, tensor)
                     for name, offset, tensor in zip(blob.names, blob.offsets, members,
                                                     strict=True)}
        except RuntimeError:  # a dtype torch cannot view bytes as: buffers of its own
            continue
        placed.update(views)
        packs[_pack_key(blob)] = flat.numpy().data.cast("B")  # the array's buffer
    tensors = {name: placed[name] if name in placed else _host_buffer(tensor)
               for name, tensor in live.items()}
    return tensors, packs


def _view_at(flat: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped and typed like ``like`` over ``flat``'s bytes from ``offset``."""
    nbytes = like.numel() * like.element_size()
    return flat[offset:offset + nbytes].view(like.dtype).view(like.shape)


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    pin = tensor.is_cuda
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)


@dataclass(frozen=True)
class Sharding:
    """Where and as which rank the persister writes parts (:meth:`Tiers.shard_into`)."""

    store: Store
    rank: int
    world_size: int
    timeout: float
    launch: str | None


class SetState(Enum):
    """What one of the two shadow buffer sets holds (:meth:`Tiers.state_of`). A set can be
    the latest capture and queued at once; it then answers ``LATEST``, the state that
    decides where the next capture goes (the order below is the order of precedence)."""

    WRITING = "writing"  # the persister reads it: never touched until done
    LATEST = "latest"  # the newest capture: the next one goes to the other set if it can
    PENDING = "pending"  # queued for writing: a newer capture may replace it
    FREE = "free"


class Tiers:
    """The RAM shadow and the background persister, sharing two buffer sets.

    States of a buffer set (:class:`SetState`): holding the latest capture, pending
    (queued for writing), being written (never touched until done), or free. A capture always goes to a set
    that is not being written; if that set was pending, the newer capture replaces the
    pending one, so a queued snapshot is never half-overwritten.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        keep: int | None = 3,
        on_commit: Callable[[dict], None] | None = None,
        stamp: Mapping[str, Any] | None = None,
        complete_meta: Callable[[dict], dict] | None = None,
    ) -> None:
        self.store, self.run_id, self.keep = store, run_id, keep
        # fills in what a capture's meta left open (on this thread, before the write)
        self.complete_meta = complete_meta
        self.stamp = stamp  # the launch's lineage fields (burst.snapshot.lineage), on each
        self.on_commit = on_commit
        self._sets = [ShadowBuffers(), ShadowBuffers()]
        self._cond = threading.Condition()
        self.latest: Captured | None = None
        self._pending: Captured | None = None
        self._writing: Captured | None = None
        self._running = False  # a write is pending or under way (flush waits for it)
        self._alive = False  # the persister thread is up (and has not decided to leave)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.committed_step: int | None = None
        # what the background work of the newest persist took (hash, write, commit, prune):
        # the adaptive interval (burst.training.adaptive) weighs it; ``writes`` counts them
        self.last_write_seconds: float | None = None
        self.writes = 0
        # the CPU and I/O priority the persister obtained (burst.snapshot.priority), once up
        self.priority: str | None = None
        self.sharding: Sharding | None = None
        self._swept_at: float | None = None  # when a prune last swept temporaries
        self._prune_owed: Store | None = None  # the store a commit left unpruned, if any

    def shard_into(self, store: Store, rank: int, world_size: int, *, timeout: float = 300.0,
                   launch: str | None = None) -> None:
        """Persist every later snapshot as this rank's part of a sharded snapshot in
        ``store`` (:func:`burst.snapshot.parts.write_part`); rank 0 also waits up to
        ``timeout`` seconds for the other ranks' parts, commits the manifest, prunes and
        calls ``on_commit``. ``launch``: an id every rank of this launch was given alike,
        so parts an earlier launch left are never merged into this one's snapshots."""
        with self._cond:
            self.sharding = Sharding(store, rank, world_size, timeout, launch)

    def capture(self, step: int, tree: dict, live: dict[str, torch.Tensor], meta: dict,
                persist: bool = False, boxes: dict[str, parts.Box] | None = None) -> Captured:
        """Copy ``live`` into host RAM (the only cost the training loop pays)."""
        with self._cond:
            buffers = self._free_set()
            replaced_pending = self._pending is not None and self._pending.buffers is buffers
            if replaced_pending:
                self._pending = None
            if self.latest is not None and self.latest.buffers is buffers:
                self.latest = None  # about to be overwritten
        captured = Captured(step, tree, buffers.copy_from(live), meta, buffers, boxes)
        with self._cond:
            self.latest = captured
        if persist or replaced_pending:
            self.persist(captured)
        return captured

    def state_of(self, buffers: ShadowBuffers) -> SetState:
        """What ``buffers`` holds now (call under the condition's lock, or in a test)."""
        for state, captured in ((SetState.WRITING, self._writing), (SetState.LATEST, self.latest),
                                (SetState.PENDING, self._pending)):
            if captured is not None and captured.buffers is buffers:
                return state
        return SetState.FREE

    def _free_set(self) -> ShadowBuffers:
        """The set the next capture overwrites: never one being written, and not the
        latest capture while the other set can take it."""
        candidates = [s for s in self._sets if self.state_of(s) is not SetState.WRITING]
        return next((s for s in candidates if self.state_of(s) is not SetState.LATEST),
                    candidates[0])

    def persist(self, captured: Captured | None = None) -> None:
        """Queue ``captured`` (default: the latest capture) for writing in the background."""
        captured = captured or self.latest
        if captured is None:
            return
        with self._cond:
            self._pending = captured
            self._running = True
            # the persister is up (writing, or idle a moment): it takes it. Alive asked
            # too: in a child forked meanwhile the flag was copied, the thread was not
            if self._alive and self._thread is not None and self._thread.is_alive():
                self._cond.notify_all()
                return
            self._alive = True
            self._thread = threading.Thread(target=self._work, name="burst-persist",
                                            daemon=True)
            self._thread.start()

    def _work(self) -> None:
        """The persister: write what is pending, newest first. Idle, it stays up for
        ``LINGER_SECONDS`` before it leaves: a run persisting every step would otherwise
        start a thread every step, and wait for it to start, in the training loop.
        It runs at idle CPU and I/O priority (and so do the pools it starts): the step
        keeps its cores, the snapshot takes what the step leaves over."""
        self.priority = priority.lower_this_thread()
        while True:
            with self._cond:
                owed = self._prune_owed if self._pending is None else None
            if owed is not None:  # idle now: the last commit's retention, before flush returns
                self._guarded(self._pruned, owed, self.committed_step)
                continue
            with self._cond:
                if self._pending is None:
                    self._running = False
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self._pending is not None, LINGER_SECONDS)
                    if self._pending is None:
                        self._alive = False
                        return
                captured, self._pending = self._pending, None
                self._writing = captured
            try:
                self._guarded(self._write, captured, captured.step)
            finally:
                with self._cond:
                    self._writing = None

    def _guarded(self, work: Callable[[Any], None], arg: Any, step: int | None) -> None:
        """``work(arg)``, a failure kept for flush() to raise and warned about now."""
        try:
            work(arg)
        except BaseException as exc:  # surfaced to the training thread by flush()
            with self._cond:
                self._error = exc
            # said now, too: a loop that never flushes would otherwise train for hours
            # believing it is protected (a full disk, a revoked mount)
            warnings.warn(f"burst: the snapshot of step {step} could not be "
                          f"written ({_one_line(exc)}); the previous snapshot is kept",
                          RuntimeWarning, stacklevel=1)

    def _write(self, captured: Captured) -> None:
        started = time.monotonic()
        sharding = self.sharding
        if sharding is None:
            self._write_whole(captured, started)
        else:
            self._write_part(captured, sharding, started)

    def _write_whole(self, captured: Captured, started: float) -> None:
        if self.complete_meta is not None:
            captured = replace(captured, meta=self.complete_meta(captured.meta))
        manifest = write_snapshot(self.store, self.run_id, captured, self.stamp)
        self.committed_step = captured.step
        self._prune_after(self.store)
        self.last_write_seconds = time.monotonic() - started
        self.writes += 1
        if self.on_commit:
            self.on_commit(manifest)

    def _write_part(self, captured: Captured, sharding: Sharding, started: float) -> None:
        """This rank's part; on rank 0 then the manifest (unless a rank skipped the step),
        pruning and ``on_commit``. The other ranks never prune: rank 0 owns retention."""
        if captured.boxes is None:
            raise SnapshotError(f"the capture of step {captured.step} has no boxes: a sharded "
                                "snapshot needs each tensor's place (burst.parallel.pieces)")
        store, rank = sharding.store, sharding.rank
        # rank 0 keeps its own report: it commits, and nobody else reads it
        report = parts.write_part(store, self.run_id, captured.step, rank, captured.tensors,
                                  captured.boxes, world_size=sharding.world_size,
                                  launch=sharding.launch, publish=rank != 0)
        manifest = None
        if rank == 0:
            meta = captured.meta
            if self.complete_meta is not None:
                meta = self.complete_meta(meta)
            manifest = parts.commit_parts(store, self.run_id, captured.step, sharding.world_size,
                                          tree=captured.tree, meta=meta, stamp=self.stamp,
                                          launch=sharding.launch, timeout=sharding.timeout,
                                          own=report)
            if manifest is not None:
                self.committed_step = captured.step
                self._prune_after(store)
        self.last_write_seconds = time.monotonic() - started
        self.writes += 1
        if manifest is not None and self.on_commit:
            self.on_commit(manifest)

    def _prune_after(self, store: Store) -> None:
        """Prune now, or, when a newer snapshot is already queued, once the persister is
        idle (before flush() returns, as ever): a queued snapshot's commit no longer
        waits behind its predecessor's retention (unlinking a dropped snapshot's blobs,
        2 ms a file on this project's test machine). Pruning is never needed for a commit
        to be complete: the newest snapshots are the ones it keeps."""
        with self._cond:
            if self._pending is not None:
                self._prune_owed = store
                return
        self._pruned(store)

    def _pruned(self, store: Store) -> None:
        with self._cond:
            self._prune_owed = None
        self._prune(store)

    def _prune(self, store: Store) -> None:
        """Keep the newest ``keep`` snapshots (:func:`prune`); sweep killed writes'
        temporaries after the first write (a restarted run clears what its killed
        predecessor left, however few snapshots there are), then once every
        ``SWEEP_SECONDS``: walking the whole run after every persist bought nothing."""
        now = time.monotonic()
        if self._swept_at is None or now - self._swept_at >= SWEEP_SECONDS:
            self._swept_at = now
            try:
                retention.sweep_temporaries(store, self.run_id)
            except (BurstError, OSError) as exc:  # housekeeping never fails a snapshot
                warnings.warn(f"burst: sweeping temporaries failed ({_one_line(exc)})",
                              RuntimeWarning, stacklevel=1)
        prune(store, self.run_id, self.keep or 0, sweep=False)

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


def write_snapshot(store: Store, run_id: str, captured: Captured,
                   stamp: Mapping[str, Any] | None = None) -> dict:
    """Commit ``captured`` into ``store`` (:func:`burst.snapshot.commit.commit`); return
    its manifest. A snapshot of a step the store already has replaces it: the persister is
    its tier's only writer, and a second commit of a step is the same state saved again
    under a newer reason (an OOM or a signal after a periodic snapshot). ``stamp``, the
    launch's lineage fields (:meth:`burst.snapshot.lineage.Lineage.stamp`), goes into the
    manifest, and the commit refuses it once a newer launch of the run took over."""
    blobs = layout_blobs(captured.tensors)
    # built once (a pack is the shadow's buffer as it lies, or gathered from its
    # tensors), hashed here and written by ``land``
    payloads = [_payload(blob, captured) for blob in blobs]
    algo = fmt.WRITE_HASH
    if sum(b.size for b in blobs) < _POOL_BYTES:  # threads would cost more than they save
        digests = [fmt.digest(data, algo) for data in payloads]
    else:
        with ThreadPoolExecutor(max_workers=4) as pool:
            digests = list(pool.map(lambda data: fmt.digest(data, algo), payloads))
    by_digest: dict[str, Blob] = dict(zip(digests, blobs, strict=True))
    payload_of = dict(zip(digests, payloads, strict=True))
    tensor_entries: dict[str, dict] = {}
    for blob, digest in zip(blobs, digests, strict=True):
        for name, offset in zip(blob.names, blob.offsets, strict=True):
            tensor_entries[name] = tensor_entry(captured.tensors[name], digest, offset)
    manifest = {
        **captured.meta,
        **(stamp or {}),
        **fmt.format_fields(sharded=False, algo=algo),
        "run_id": run_id,
        "step": captured.step,
        "state": captured.tree,
        "tensors": tensor_entries,
        "blobs": {digest: {"size": blob.size} for digest, blob in by_digest.items()},
    }

    def land(digest: str, _size: int) -> None:
        store.put(fmt.blob_key(run_id, digest), payload_of[digest])

    raw = fmt.encode_manifest(manifest)
    commit(store, run_id, captured.step, raw,
           {digest: blob.size for digest, blob in by_digest.items()}, land,
           overwrite=True, points="snapshot", parsed=manifest)
    remember_digests(raw, run_id, captured.step, frozenset(by_digest))
    return manifest


def _payload(blob: Blob, captured: Captured) -> memoryview:
    """A blob's bytes: a shadow's pack as it lies, else gathered from its tensors."""
    packed = captured.buffers.packed(blob) if captured.buffers is not None else None
    return packed if packed is not None else blob.payload(captured.tensors)


def prune(store: Store, run_id: str, keep: int, *, sweep: bool = True) -> list[int]:
    """Keep the newest ``keep`` snapshots; delete older manifests, then unreferenced blobs.

    A thin wrapper over :func:`burst.snapshot.retention.gc`, which owns the ordering that
    keeps this safe against crashes and concurrent uploads; returns the dropped steps.
    ``sweep``: also remove the temporaries of killed writes (see ``gc``).
    """
    if keep < 1 or len(list_steps(store, run_id)) <= keep:
        return []
    return retention.gc(store, run_id, keep_last=keep, sweep=sweep).dropped

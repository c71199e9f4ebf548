"""Retention and garbage collection: which snapshots to keep, and deleting the rest safely.

The rule: keep the newest ``keep_last`` snapshots, plus, with ``keep_every=M``, the first
snapshot in every window of M steps (steps 0..M-1, M..2M-1, ...). The windows are fixed by
step number, so a snapshot kept for its window stays kept as newer ones arrive, whatever
the snapshot cadence.

Deleting is ordered so that no crash and no concurrent upload can break a kept snapshot:

1. list the blobs (anything uploaded after this is never a candidate);
2. read the upload markers of pushes in progress (their blobs are protected);
3. list and read the manifests, and decide what to keep;
4. delete dropped manifests first (a crash now leaves garbage, never a manifest whose
   blobs are gone), then blobs that nothing kept or in flight references.

A kept manifest that cannot be read stops the blob sweep: burst would rather keep garbage
than guess. Markers older than ``marker_ttl`` belong to pushes that died and are removed,
and so are the leftovers of killed writes (:mod:`burst.snapshot.sweep`): temporaries of
writes killed before their rename (a store that writes through temporaries, such as a
local directory or SFTP, sweeps those it holds), and the parts of sharded snapshots whose
step no fresh marker covers. The parts are listed with the blobs, before the markers are
read, so a part written after that is never a candidate.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from burst import killpoints
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import sweep as leftovers
from burst.snapshot.reader import list_steps, referenced_blobs
from burst.store.base import Store

MARKER_TTL = 24 * 3600.0
# A local store's temporaries are judged by their writer's lock (burst.store.local): a dead
# write's goes at once. Where a store has no locks (SFTP, a filesystem without them), one
# idle this long belongs to a write that died: the marker of any upload still alive is
# younger (GC already treats older ones as dead), and a live writer touches its temporary
# as it writes.
TEMP_TTL = MARKER_TTL


@dataclass
class GCReport:
    kept: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    blobs_deleted: int = 0
    bytes_freed: int = 0
    protected_in_flight: int = 0
    temporaries_deleted: int = 0
    temporary_bytes: int = 0
    parts_deleted: int = 0  # part reports of sharded steps no live upload covers
    part_bytes: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def select(steps: list[int], keep_last: int, keep_every: int | None = None) -> set[int]:
    """The steps to keep: the newest ``keep_last``, and the first in each ``keep_every`` window."""
    ordered = sorted(steps)
    kept = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        windows: dict[int, int] = {}
        for step in ordered:
            windows.setdefault(step // keep_every, step)
        kept.update(windows.values())
    return kept


def gc(store: Store, run_id: str, keep_last: int = 3, keep_every: int | None = None, *,
       dry_run: bool = False, marker_ttl: float = MARKER_TTL, temp_ttl: float = TEMP_TTL,
       sweep: bool = True) -> GCReport:
    """Drop snapshots the rule does not keep, then every blob no kept snapshot references.

    ``sweep``: also remove what killed writes left (:mod:`burst.snapshot.sweep`: a walk
    of the whole run); a persister pruning after every write asks for it now and then,
    not every time."""
    if keep_last < 1 and not keep_every:
        raise SnapshotError("refusing to delete every snapshot: keep at least one")
    blob_keys = store.list(f"{run_id}/blobs/")
    part_keys = store.list(f"{run_id}/parts/") if sweep else []
    in_flight = _in_flight(store, run_id, marker_ttl, dry_run)
    steps = list_steps(store, run_id)
    kept = select(steps, keep_last, keep_every)
    report = GCReport(kept=sorted(kept), dropped=[s for s in steps if s not in kept],
                      dry_run=dry_run)
    referenced = _referenced(store, run_id, report.kept)
    killpoints.hit("gc.decided")
    if sweep:
        report.temporaries_deleted, report.temporary_bytes = leftovers.temporaries(
            store, run_id, temp_ttl, dry_run=dry_run,
            protected={fmt.blob_key(run_id, digest) for digest in in_flight.blobs})
        report.parts_deleted, report.part_bytes = leftovers.parts(
            store, run_id, part_keys, in_flight.steps, dry_run=dry_run)
    if not dry_run:
        for step in report.dropped:
            store.delete(fmt.manifest_key(run_id, step))
            killpoints.hit("gc.manifest-deleted")
    for key in blob_keys:
        digest = key.rsplit("/", 1)[-1]
        if digest in referenced:
            continue
        if digest in in_flight.blobs:
            report.protected_in_flight += 1
            continue
        report.blobs_deleted += 1
        report.bytes_freed += store.size(key) or 0
        if not dry_run:
            store.delete(key)
            killpoints.hit("gc.blob-deleted")
    return report


def sweep_temporaries(store: Store, run_id: str, older_than: float = TEMP_TTL) -> int:
    """Remove the run's temporaries that writes killed mid-way left (no live writer holds
    them; where that cannot be told, idle for ``older_than`` seconds); return how many.
    Object stores have none: their writes are atomic on the server."""
    return leftovers.temporaries(store, run_id, older_than)[0]


def _referenced(store: Store, run_id: str, steps: list[int]) -> set[str]:
    referenced: set[str] = set()
    for step in steps:
        try:
            referenced.update(referenced_blobs(store, run_id, step))
        except SnapshotError as exc:
            raise SnapshotError(f"not collecting garbage: kept snapshot {run_id}@{step} "
                                f"cannot be read ({exc})") from None
    return referenced


class InFlight(NamedTuple):
    """What the fresh upload markers say is being written."""

    blobs: set[str]  # digests of the blobs they name
    steps: set[int]  # the steps they are for (a sharded step's parts live while one does)


def _in_flight(store: Store, run_id: str, ttl: float, dry_run: bool) -> InFlight:
    """What the markers of pushes in progress name; stale markers are cleared."""
    found = InFlight(set(), set())
    now = time.time()
    for key in store.list(f"{run_id}/uploads/"):
        try:
            marker = json.loads(store.get(key))
            started, digests = float(marker["time"]), list(marker["blobs"])
        except (KeyError, ValueError, TypeError):
            continue  # vanished (push finished) or unreadable: protects nothing
        if now - started > ttl:
            if not dry_run:
                store.delete(key)
            continue
        found.blobs.update(str(d) for d in digests)
        step = leftovers.marker_step(key)
        if step is not None:
            found.steps.add(step)
    return found

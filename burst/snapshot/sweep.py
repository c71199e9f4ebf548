"""What killed writes leave in a store, and which of it is dead: temporaries and parts.

Two kinds of leftovers are invisible to the retention rule (:mod:`burst.snapshot.retention`),
which only sees manifests and blobs:

* **temporaries**: a write killed between creating its temporary and renaming it into
  place leaves ``.<name>.<random>.tmp`` (a local store, SFTP), hidden from listings. Each
  store judges its own (:meth:`burst.store.local.LocalStore.sweep_temporaries`: by its
  writer's lock; :meth:`burst.store.sftp.SFTPStore.sweep_temporaries`: by its age on the
  server's clock, never one of a blob a live upload marker names). Object stores have
  none: their writes are atomic on the server.
* **parts** of sharded snapshots (:mod:`burst.snapshot.parts`): each rank writes
  ``parts/<step>/<rank>.json`` after its upload marker ``uploads/<step>.r<rank>.json``, and
  rank 0 deletes both for every older step when it commits. A launch that crashed at a
  step no later commit passed (a resume from an older snapshot, a run that ended) leaves
  them forever. A step's parts are live while any upload marker of that step is fresh
  (younger than the marker age GC already uses): every rank writes its marker before its
  part, so a part without a fresh marker of its step belongs to a launch that died (its
  markers expired) and nothing will ever merge it.

The race left: a part listed, then found without a fresh marker, is deleted by key; a
rank that wrote that step's marker and part again in between (a step re-persisted more
than the marker age after its last write) loses that part, and rank 0 then gives that
step up after its timeout. No snapshot is lost; the next step commits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.store.base import Store


def temporaries(store: Store, run_id: str, older_than: float, *,
                protected: Collection[str] = (), dry_run: bool = False) -> tuple[int, int]:
    """Remove the run's temporaries that killed writes left (``protected``: keys an
    upload in flight may still be writing); return how many, and their bytes."""
    sweep = getattr(store, "sweep_temporaries", None)
    if sweep is None:
        return 0, 0
    count, size = sweep(f"{run_id}/", older_than, protected=protected, dry_run=dry_run)
    return int(count), int(size)


def marker_step(key: str) -> int | None:
    """The step an upload marker's key names (a commit's ``<step>.json``, a rank's
    ``<step>.r<rank>.json``), or None for anything else under ``uploads/``."""
    digits = key.rsplit("/", 1)[-1].split(".", 1)[0]
    try:
        step = int(digits)
        return step if fmt.check_step(step) == digits else None
    except (ValueError, SnapshotError):
        return None


def orphaned_parts(run_id: str, part_keys: Iterable[str], live_steps: Collection[int]
                   ) -> list[str]:
    """The part reports among ``part_keys`` whose step no fresh upload marker covers."""
    return [key for key in part_keys
            if (step := _part_step(run_id, key)) is not None and step not in live_steps]


def parts(store: Store, run_id: str, part_keys: Iterable[str], live_steps: Collection[int],
          *, dry_run: bool = False) -> tuple[int, int]:
    """Delete the orphaned parts among ``part_keys`` (listed before the markers were
    read); return how many, and their bytes."""
    count = size = 0
    for key in orphaned_parts(run_id, part_keys, live_steps):
        found = store.size(key)
        if found is None:
            continue  # rank 0 cleaned it meanwhile
        if not dry_run:
            store.delete(key)
        count, size = count + 1, size + found
    return count, size


def _part_step(run_id: str, key: str) -> int | None:
    """The step of a part report's key (:func:`burst.snapshot.format.part_key`), or None
    for anything else under ``parts/``."""
    step_name, _, file_name = key[len(f"{run_id}/parts/"):].partition("/")
    try:
        step, rank = int(step_name), int(file_name.removesuffix(".json"))
        return step if fmt.part_key(run_id, step, rank) == key else None
    except (ValueError, SnapshotError):
        return None

"""Which snapshots of its local tier a launch may restore: the fence decides there too.

A snapshot in the store passed the fence as it was committed (:func:`burst.snapshot.
lineage.check`, before and after its manifest was written), and a pull copies only those.
The local tier has no lineage of its own, so it takes every snapshot its writer makes,
and a fenced writer's refused snapshot stays there. Relaunched on that machine, the run
would find it newer than anything in the store and restore it: the history the newer
launch wrote would lose to the one it replaced.

So before a restore each local snapshot is judged, with one ``LIST`` of the run's
generations: it stays restorable when it is older than fencing, this launch's own, the
same snapshot the store holds (same generation and token: it was published), or one
the fence would upload now (no other launch took over since: a restart on the same
machine keeps its catch-up); otherwise it is refused, and each refusal is told to
``log`` (a warning and a ``snapshot-skipped`` event), never silently. A launch that is
itself replaced already (a newer generation exists as it attaches) is marked fenced.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from burst.errors import BurstError
from burst.snapshot import format as fmt
from burst.snapshot import lineage
from burst.snapshot.reader import check_manifest_size, list_steps
from burst.store.base import Store


def refused_steps(local: Store, store: Store, run_id: str, own: lineage.Lineage | None,
                  remote_steps: Collection[int], log: Callable[[str], None]) -> set[int]:
    """The local tier's steps that launch ``own`` must not restore (each told to ``log``);
    ``remote_steps``: the steps the store holds. Marks ``own`` fenced when a newer
    launch already took over."""
    if own is None:
        return set()
    taken = lineage.generations(store, run_id)
    if taken and taken[-1] > own.generation:
        own.fenced_by = taken[-1]
    if local is store or local.url == store.url:
        return set()  # commits into the store itself are fenced as they are made
    refused = set()
    for step in list_steps(local, run_id):
        raw = _raw(local, run_id, step)
        if raw is None:
            continue  # damaged: the restore's fallback says so
        why = lineage.refusal(store, run_id, raw, own, taken=taken)
        if why is None or (step in remote_steps and _published(store, run_id, step, raw)):
            continue
        refused.add(step)
        log(f"snapshot {run_id}@{step} in the local tier is not restored: {why}")
    return refused


def _raw(store: Store, run_id: str, step: int) -> bytes | None:
    key = fmt.manifest_key(run_id, step)
    try:
        check_manifest_size(store, key)
        return store.get(key)
    except (KeyError, BurstError, OSError):
        return None


def _published(store: Store, run_id: str, step: int, raw: bytes) -> bool:
    """Whether the store holds this very snapshot (the fence let it in)."""
    remote = _raw(store, run_id, step)
    return remote is not None and lineage.stamp_of(remote) == lineage.stamp_of(raw)

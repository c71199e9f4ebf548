"""The one way a snapshot enters a store: blobs first, each verified, the manifest last.

Every writer commits through :func:`commit`: the persister writing the local tier
(:mod:`burst.snapshot.tiers`), a push to a remote store and a pull back into the local
tier (:mod:`burst.snapshot.sync`). The order is what makes a snapshot complete or
invisible on every backend (each store write is atomic, :mod:`burst.store.base`):

1. write an upload marker naming the blobs, so a ``burst gc`` running meanwhile keeps them
   (:mod:`burst.snapshot.retention`);
2. write every blob the store lacks (largest first, a few at a time) and check the size
   each one landed with; a blob already there under its content-addressed name is skipped;
3. write the manifest, the only thing readers look for;
4. check every blob again and re-write any that a GC racing between steps 2 and 3 removed
   (a visible manifest whose blob is gone would be a broken snapshot);
5. delete the marker.

Right before step 3, and again right after it, the commit checks the run's lineage fence
(:func:`burst.snapshot.lineage.check`, one ``LIST`` each): a launch that a newer launch of
the run replaced (a local training after ``burst schedule`` burst it to the cloud) gets
:class:`~burst.snapshot.lineage.FencedError` instead of a manifest, and a manifest that
landed in the window between the two checks is deleted again (the module doc of
:mod:`burst.snapshot.lineage` says why this bounds the split brain).

A crash or a failed write anywhere before step 3 leaves garbage blobs (GC collects them)
and no manifest, so the store still shows exactly what it showed before: a failed upload
leaves the previous snapshot intact.

The manifest write is the one decision a writer makes, and it depends on who else can
write the same step:

* ``overwrite=False``, first writer wins, for a store other machines write too (a push to
  the remote). The manifest goes in with ``put_if_absent`` (atomic where the backend can
  make it so), and a step already there is not touched: the commit sends nothing and
  returns False. A published step then never changes under its readers: a resume that
  planned from step N (its batch layout, its failure reason) pulls that same step N later,
  even if a node thought dead is still pushing next to its replacement. A retried push
  finds its own manifest and is a no-op, and a retried manifest write whose first attempt
  did land (the answer was lost) reads as "already there", which it is.
* ``overwrite=True``, newest wins, for a tier one process writes (the persister's local
  tier; a pull, which puts the copy the user asked for in place). There the only second
  writer of a step is that same process re-committing the state it just saved under a new
  reason (an OOM or a signal snapshot at the step a periodic one already holds), and the
  newest reason must be the one stored, since resume planning reads it. ``put`` replaces
  the manifest atomically: a reader sees the old commit or the new one, both complete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from burst import killpoints
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import lineage
from burst.store.base import Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry

WORKERS = 4  # blobs written at once
Land = Callable[[str, int], None]  # writes one blob (digest, size) into the store
OnBlob = Callable[[int, bool], None]  # (size, True if written / False if already there)


def commit(dst: Store, run_id: str, step: int, manifest: bytes, blobs: dict[str, int],
           land: Land, *, overwrite: bool, points: str, policy: RetryPolicy = DEFAULT_RETRY,
           on_blob: OnBlob | None = None, parsed: Mapping[str, Any] | None = None) -> bool:
    """Commit one snapshot (``blobs``: digest -> size) into ``dst``; see the module doc.

    ``land`` writes one blob's bytes (retrying what it can; this checks what landed).
    ``points`` prefixes the kill points (:mod:`burst.killpoints`). ``parsed``: the
    manifest as the caller built it, if it has it, so the fence reads its generation
    without parsing the bytes (twice a commit, every persist). Returns False when
    ``overwrite`` is off and the step was already there, True when this manifest is in.

    Both passes over the blobs (writing them, then checking them after the manifest)
    share one set of threads: a thread started from the idle-priority persister waits
    to be first scheduled, which on a busy machine cost more than checking the blobs.
    """
    with _workers(len(blobs)) as pool:
        return _commit(dst, run_id, step, manifest, blobs, land, overwrite=overwrite,
                       points=points, policy=policy, on_blob=on_blob, parsed=parsed, pool=pool)


def _commit(dst: Store, run_id: str, step: int, manifest: bytes, blobs: dict[str, int],
            land: Land, *, overwrite: bool, points: str, policy: RetryPolicy,
            on_blob: OnBlob | None, parsed: Mapping[str, Any] | None,
            pool: ThreadPoolExecutor | None) -> bool:
    fenced = manifest if parsed is None else parsed
    key = fmt.manifest_key(run_id, step)
    if not overwrite and retry(lambda: dst.size(key), policy) is not None:
        return False
    marker = fmt.marker_key(run_id, step)
    retry(lambda: dst.put(marker, fmt.encode_marker(blobs)), policy)
    killpoints.hit(f"{points}.marker-written")

    def write(digest: str) -> None:
        present = retry(lambda: dst.size(fmt.blob_key(run_id, digest)), policy) == blobs[digest]
        if not present:
            _land(dst, run_id, digest, blobs[digest], land, points, policy)
        if on_blob is not None:
            on_blob(blobs[digest], not present)

    each_blob(write, sorted(blobs, key=blobs.__getitem__, reverse=True), pool)
    killpoints.hit(f"{points}.blobs-written")
    try:
        lineage.check(dst, run_id, fenced, publishing=not overwrite, policy=policy)
    except lineage.FencedError:
        retry(lambda: dst.delete(marker), policy)  # the blobs are garbage for GC
        raise
    if overwrite:
        retry(lambda: dst.put(key, manifest), policy)
        written = True
    else:
        written = retry(lambda: dst.put_if_absent(key, manifest), policy)
    killpoints.hit(f"{points}.manifest-written")
    if written:
        _recheck(dst, run_id, key, manifest, fenced, overwrite, marker, policy)

    def repair(digest: str) -> None:  # a GC raced us between the blob and the manifest
        if retry(lambda: dst.size(fmt.blob_key(run_id, digest)), policy) != blobs[digest]:
            _land(dst, run_id, digest, blobs[digest], land, points, policy)
            if on_blob is not None:
                on_blob(blobs[digest], True)

    each_blob(repair, list(blobs), pool)
    retry(lambda: dst.delete(marker), policy)
    killpoints.hit(f"{points}.marker-deleted")
    return written


def _recheck(dst: Store, run_id: str, key: str, manifest: bytes,
             fenced: bytes | Mapping[str, Any], overwrite: bool, marker: str,
             policy: RetryPolicy) -> None:
    """The fence again, after the manifest landed (:mod:`burst.snapshot.lineage`, "the
    window"): a newer launch that took over meanwhile gets the manifest taken back."""
    try:
        lineage.check(dst, run_id, fenced, publishing=not overwrite, policy=policy)
    except lineage.FencedError:
        # put_if_absent wrote it, so it is ours; an overwrite only while it still is
        if not overwrite or _holds(dst, key, manifest, policy):
            retry(lambda: dst.delete(key), policy)
        retry(lambda: dst.delete(marker), policy)
        raise


def _holds(dst: Store, key: str, manifest: bytes, policy: RetryPolicy) -> bool:
    try:
        return retry(lambda: dst.get(key), policy) == manifest
    except KeyError:
        return False


def _land(dst: Store, run_id: str, digest: str, size: int, land: Land, points: str,
          policy: RetryPolicy) -> None:
    """Write one blob and check the size it landed with."""
    killpoints.hit(f"{points}.blob")
    land(digest, size)
    landed = retry(lambda: dst.size(fmt.blob_key(run_id, digest)), policy)
    if landed != size:
        raise SnapshotError(f"blob {digest[:12]} landed in {dst.url} as {landed} bytes, "
                            f"wrote {size}")


def each_blob(fn: Callable[[str], None], items: list[str],
              pool: ThreadPoolExecutor | None = None) -> None:
    """Run ``fn`` over ``items`` (blob digests) on a few threads (``pool``'s, or ones of
    its own); the first failure is raised. Every writer of blobs lands them this way (a
    sharded snapshot's parts too)."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    if pool is None:
        with _workers(len(items)) as own:
            each_blob(fn, items, own)
        return
    for future in [pool.submit(fn, item) for item in items]:
        future.result()


@contextmanager
def _workers(items: int) -> Iterator[ThreadPoolExecutor | None]:
    """Threads for ``items`` blobs; none for one (it is written on the caller's thread)."""
    if items <= 1:
        yield None
        return
    with ThreadPoolExecutor(min(WORKERS, items), thread_name_prefix="burst-commit") as pool:
        yield pool

"""A blob whose bytes do not match its name is no snapshot's data: it leaves the store.

Blobs are named by their hash, and every writer skips a blob the store already holds at
its size (a persist writes only what changed). A blob damaged in place (a bit flipped on
a disk, a copy refilled by something else) would therefore be skipped by every later
persist that produces the same bytes, and the step a run replays after falling back to
an older snapshot produces exactly those: each new snapshot would name the damaged copy
again, and each restore would fall back again. So the reader that finds the damage reads
the blob once more, whole, and deletes it if it still does not match its name; the next
persist then writes it afresh. Nothing is lost: no snapshot can use bytes that are not
the ones its manifest names.
"""

from __future__ import annotations

from burst.errors import StoreError
from burst.snapshot import format as fmt
from burst.store.base import Store

READ_BYTES = 64 << 20  # the blob is hashed in pieces of this size, never held whole


def condemn(store: Store, run_id: str, digest: str, algo: str) -> bool:
    """Delete blob ``digest`` of ``run_id`` if its bytes, read again, do not match its
    name by ``algo`` (whether it was deleted). A second read that matches means the
    first one was damaged on the way, not in the store: the blob stays."""
    key = fmt.blob_key(run_id, digest)
    try:
        if _matches(store, key, digest, algo):
            return False
        store.delete(key)
    except (KeyError, StoreError):
        return False  # gone already, or the store cannot say now: the next reader asks again
    return True


def _matches(store: Store, key: str, digest: str, algo: str) -> bool:
    size = store.size(key)
    if size is None:
        raise KeyError(key)
    hasher = fmt.new_hasher(algo)
    for start in range(0, size, READ_BYTES):
        hasher.update(store.read_range(key, start, min(READ_BYTES, size - start)))
    return hasher.hexdigest() == digest


"""Does the store accept what a burst will ask of it, with the credentials in use?

A burst writes blobs and manifests, reads them back on the node, claims snapshots with
conditional writes (two writers must never both win one) and deletes what retention drops.
Each of the four is tried for real on a small object under the store's reserved
``preflight/`` prefix (no run can be named so), and the objects are removed again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from burst.preflight.table import FAIL, OK, UNKNOWN, Row
from burst.store.base import Store

PREFIX = "preflight"  # reserved in burst.store.base.SHARED_PREFIXES

WRITE, READ, CONDITIONAL, DELETE = ("store write", "store read", "store conditional write",
                                    "store delete")


def probe_key(tag: str) -> str:
    """A key of this preflight alone: two checks at once never touch each other's."""
    return f"{PREFIX}/{uuid.uuid4().hex}-{tag}"  # flat: a file store keeps no empty folders


def store_rows(store: Store) -> list[Row]:
    """The four rows, in the order a burst needs them; a row after a failed write is
    unknown (there is nothing to read or delete), never a pass."""
    payload = os.urandom(64)
    key, claim = probe_key("object"), probe_key("claim")
    rows = [_try(WRITE, lambda: _write(store, key, payload), _write_fix(store))]
    if rows[0].status != OK:
        return rows + [Row(name, UNKNOWN, "not tried: the write failed")
                       for name in (READ, CONDITIONAL, DELETE)]
    rows.append(_try(READ, lambda: _read(store, key, payload),
                     f"the credentials need read access to {store.url}"))
    rows.append(_try(CONDITIONAL, lambda: _conditional(store, claim, payload),
                     "use a server that honours If-None-Match on PUT (S3, OSS, MinIO, "
                     "SeaweedFS do), or a file:// or sftp:// store"))
    rows.append(_try(DELETE, lambda: _delete(store, (key, claim)),
                     f"the credentials need delete access to {store.url} (retention and gc "
                     "remove old snapshots)"))
    return rows


def _try(name: str, check: Callable[[], str], fix: str) -> Row:
    """Run one check; any failure it raises becomes a failed row with its one-line reason."""
    try:
        return Row(name, OK, check())
    except Exception as error:  # the store's own error says what went wrong: show it
        return Row(name, FAIL, _one_line(error), fix)


def _write(store: Store, key: str, payload: bytes) -> str:
    store.put(key, payload)
    return f"wrote {len(payload)} bytes under {PREFIX}/"


def _read(store: Store, key: str, payload: bytes) -> str:
    got = store.get(key)
    if got != payload:
        raise RuntimeError(f"read back {len(got)} bytes that differ from the {len(payload)} "
                           "written")
    return "read back what was written"


def _conditional(store: Store, key: str, payload: bytes) -> str:
    if not store.put_if_absent(key, payload):
        raise RuntimeError("the first conditional write was refused on a new key")
    if store.put_if_absent(key, payload):
        raise RuntimeError("a second conditional write to the same key succeeded: two "
                           "writers could both claim one snapshot")
    return "the first write won, the second was refused"


def _delete(store: Store, keys: tuple[str, ...]) -> str:
    for key in keys:
        store.delete(key)
    left = [key for key in keys if store.size(key) is not None]
    if left:
        raise RuntimeError(f"{len(left)} object(s) still there after delete")
    return "deleted, and gone"


def _write_fix(store: Store) -> str:
    return (f"the credentials in use cannot write to {store.url}: use a key allowed to put, "
            "get and delete objects there (a read-only key cannot back a run up), and check "
            "the bucket and endpoint")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]

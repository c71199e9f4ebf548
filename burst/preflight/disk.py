"""Has the local tier room for the next snapshot?

A snapshot is persisted to local disk before it is uploaded, and the emergency snapshot
after a crash goes there too; a full disk loses exactly the snapshot that matters. The
next snapshot is at most as big as the newest one (unchanged blobs are shared, so usually
much smaller): the row passes when the local tier's file system has that much free,
with a tenth more for the manifest and what the file system keeps for itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from burst.preflight.table import FAIL, OK, SKIP, Row
from burst.snapshot import reader
from burst.snapshot.catalog import human_bytes
from burst.store.base import Store

NAME = "local disk"
HEADROOM = 1.1


def snapshot_bytes(manifest: dict) -> int:
    """The bytes of a snapshot's blobs (what persisting it writes, at most)."""
    blobs = manifest.get("blobs") or {}
    return sum(int(info.get("size", 0)) for info in blobs.values() if isinstance(info, dict))


def disk_row(local_root: Path | None, stores: list[Store], run_id: str) -> Row:
    """``local_root``: the local tier's directory (None: the run has no local tier here);
    ``stores``: where to look for the run's newest snapshot, the local tier first."""
    if local_root is None:
        return Row(NAME, SKIP, "no local tier on this machine")
    manifest = next((m for m in (reader.read_manifest(s, run_id) for s in stores) if m),
                    None)
    if manifest is None:
        return Row(NAME, SKIP, f"run {run_id!r} has no snapshot yet to size the next one by")
    need = int(snapshot_bytes(manifest) * HEADROOM)
    free = shutil.disk_usage(_existing(local_root)).free
    what = (f"{human_bytes(free)} free at {local_root}; the newest snapshot (step "
            f"{manifest.get('step')}) is {human_bytes(snapshot_bytes(manifest))}")
    if free < need:
        return Row(NAME, FAIL, what, f"free at least {human_bytes(need - free)} there, or move "
                   "the local tier (--local / $BURST_LOCAL) to a bigger disk")
    return Row(NAME, OK, what)


def _existing(path: Path) -> Path:
    """The nearest directory that exists (the tier is made on the first snapshot)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")

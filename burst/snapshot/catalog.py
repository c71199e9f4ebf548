"""What a store holds: its runs, and each run's snapshots with what each one added.

"New bytes" is what a snapshot added over the one before it (blobs the previous snapshot
did not have): the bytes its upload actually had to send, given content-addressed blobs.
"""

from __future__ import annotations

from typing import Any

from burst.errors import BurstError
from burst.snapshot.reader import list_steps, read_manifest
from burst.store.base import Store


def list_runs(store: Store) -> list[dict[str, Any]]:
    """Every run with at least one complete snapshot: id, count, newest step and time.

    One run's damage is that run's row, never the listing: a run whose newest manifest
    cannot be read (corrupt, too big, unreadable) is listed with ``error`` saying why, and
    every other run still lists. Good rows carry ``error: None``; :func:`unreadable` picks
    out the bad ones, so a command can list them and still exit non-zero."""
    runs: dict[str, list[str]] = {}
    for key in store.list(""):
        parts = key.split("/")
        if len(parts) == 3 and parts[1] == "snapshots" and parts[2].endswith(".json"):
            runs.setdefault(parts[0], []).append(key)
    out = []
    for run_id in sorted(runs):
        try:
            row = _run_row(store, run_id)
        except (BurstError, OSError) as exc:  # one run's manifest, not the store, failed
            row = {"run": run_id, "snapshots": len(runs[run_id]), "newest_step": None, "time": None,
                   "reason": None, "error": str(exc) or type(exc).__name__}
        if row is not None:
            out.append(row)
    return out


def _run_row(store: Store, run_id: str) -> dict[str, Any] | None:
    steps = list_steps(store, run_id)
    if not steps:
        return None
    newest = read_manifest(store, run_id, steps[-1]) or {}
    return {"run": run_id, "snapshots": len(steps), "newest_step": steps[-1],
            "time": newest.get("time", "?"), "reason": newest.get("reason", "?"),
            "error": None}


def unreadable(runs: list[dict[str, Any]]) -> str | None:
    """One line naming the runs :func:`list_runs` could not read (None when it read them
    all): what a listing says after its table, before it exits non-zero."""
    bad = [run for run in runs if run.get("error")]
    if not bad:
        return None
    named = "; ".join(f"{run['run']} ({run['error']})" for run in bad[:3])
    more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
    return f"{len(bad)} of {len(runs)} runs could not be read: {named}{more}"


def snapshot_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """One row per complete snapshot of ``run_id``, oldest first."""
    rows = []
    previous: set[str] = set()
    for step in list_steps(store, run_id):
        manifest = read_manifest(store, run_id, step)
        if manifest is None:
            continue
        blobs = manifest["blobs"]
        counters = manifest.get("counters", {})
        rows.append({
            "step": manifest["step"],
            "epoch": counters.get("epoch"),
            "samples_consumed": counters.get("samples_consumed"),
            "time": manifest.get("time", "?"),
            "bytes": sum(info["size"] for info in blobs.values()),
            "new_bytes": sum(info["size"] for d, info in blobs.items() if d not in previous),
            "reason": manifest.get("reason", "?"),
        })
        previous = set(blobs)
    return rows


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"

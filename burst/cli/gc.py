"""``burst gc``: apply the retention rule to a run and delete unreferenced blobs."""

from __future__ import annotations

import json

import click

from burst.cli.options import json_option, store_option, store_settings
from burst.deadline.timespec import parse_duration
from burst.errors import SnapshotError
from burst.snapshot import retention
from burst.snapshot.catalog import human_bytes
from burst.store import open_store


@click.command("gc")
@click.argument("run_id")
@store_option
@click.option("--keep-last", type=click.IntRange(min=0), default=3, show_default=True,
              help="Keep this many newest snapshots.")
@click.option("--keep-every", type=click.IntRange(min=1), default=None,
              help="Also keep the first snapshot in every window of this many steps.")
@click.option("--dry-run", is_flag=True, help="Say what would go; delete nothing.")
@click.option("--stale-after", default=None, metavar="DURATION",
              help="Take uploads and temporaries nothing wrote for this long (24h, 30m) "
                   f"for dead ones.  [default: {retention.MARKER_TTL / 3600:g}h]")
@store_settings
@json_option
def gc(run_id: str, store_url: str, keep_last: int, keep_every: int | None, dry_run: bool,
       stale_after: str | None, settings: dict, as_json: bool) -> None:
    """Delete RUN_ID's snapshots outside the retention rule, then blobs nothing keeps.

    Also sweeps what killed writes left: temporaries, and parts of sharded steps that
    were never committed. Safe while an upload runs: blobs, temporaries and parts of
    pushes in progress are never deleted.
    """
    marker_ttl, temp_ttl = retention.MARKER_TTL, retention.TEMP_TTL
    if stale_after is not None:
        marker_ttl = temp_ttl = parse_duration(stale_after, what="--stale-after").total_seconds()
    store = open_store(store_url, **settings)
    if not store.list(f"{run_id}/"):  # a typo'd run id must not look like a clean store
        raise SnapshotError(f"run {run_id!r} has nothing in {store.url}")
    report = retention.gc(store, run_id, keep_last, keep_every, dry_run=dry_run,
                          marker_ttl=marker_ttl, temp_ttl=temp_ttl)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=1))
        return
    verb = "would drop" if dry_run else "dropped"
    click.echo(f"{run_id}: kept {len(report.kept)} snapshots, {verb} {len(report.dropped)}"
               f"{' ' + str(report.dropped) if report.dropped else ''}; "
               f"{report.blobs_deleted} blobs ({human_bytes(report.bytes_freed)}) "
               f"{'would be ' if dry_run else ''}freed{_leftovers(report)}")


def _leftovers(report: retention.GCReport) -> str:
    """What of killed writes went (or would go), when anything did."""
    swept = [f"{count} {what} ({human_bytes(size)})" for count, what, size in (
        (report.temporaries_deleted, "temporaries", report.temporary_bytes),
        (report.parts_deleted, "orphaned parts", report.part_bytes)) if count]
    if not swept:
        return ""
    return f"; {'would sweep' if report.dry_run else 'swept'} {' and '.join(swept)}"


COMMANDS = (gc,)

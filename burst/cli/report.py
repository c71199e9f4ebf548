"""``burst report RUN``: write an HTML page with PNG charts of a run's history."""

from __future__ import annotations

import json
from pathlib import Path

import click

from burst import events
from burst.cli.options import json_option, local_option, open_existing, store_option
from burst.errors import SnapshotError
from burst.store import Store, is_local, open_store


@click.command("report")
@click.argument("run_id")
@store_option
@local_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Folder to write into  [default: ./burst-report-RUN]")
@click.option("--memory-threshold", type=click.FloatRange(0, 1), default=0.8,
              show_default=True, help="Alert line on the memory chart (a recorded alert's "
              "threshold wins).")
@json_option
def report(run_id: str, store_url: str, local_url: str, out_dir: Path | None,
           memory_threshold: float, as_json: bool) -> None:
    """Write an HTML report of RUN: loss, throughput and GPU memory over time, each
    snapshot, failure and resume, and where the run went.

    \b
    Example:
      burst report my-run --store s3://bucket/runs --out report/
      open report/index.html
    """
    store = open_existing(store_url)
    more = [] if is_local(store) else [open_store(local_url)]  # the agent's local history
    if not any(_holds(s, run_id) for s in (store, *more)):  # not an empty report of a typo
        raise SnapshotError(f"run {run_id!r} has nothing in {store.url}")
    from burst.report import write_report  # matplotlib loads only for a report to draw
    written = write_report(store, run_id, out_dir or Path(f"burst-report-{run_id}"), *more,
                           threshold=memory_threshold)
    if as_json:
        click.echo(json.dumps(written.as_dict(), indent=1))
        return
    facts = ", ".join(f"{k} {v}" for k, v in written.summary.items()
                      if k in ("final step", "snapshots", "failures", "resumes"))
    from burst.cli.console import shown

    click.echo(shown(f"wrote {written.html} ({facts})"))
    if written.membership:
        from burst.report.tables import MEMBERSHIP_COLUMNS, membership_rows

        rows = [list(MEMBERSHIP_COLUMNS), *membership_rows(written.membership)]
        click.echo(_columns([[shown(cell) for cell in row] for row in rows]))


def _columns(rows: list[list[str]]) -> str:
    """Rows as left-aligned columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _holds(store: Store, run_id: str) -> bool:
    """Whether ``store`` has a snapshot or an event of ``run_id`` (two small listings, not
    a walk over every blob)."""
    return (bool(store.list(f"{run_id}/snapshots/"))
            or events.exists(store, run_id))


COMMANDS = (report,)

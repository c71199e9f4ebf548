"""``burst ls``, ``burst show`` and ``burst verify``: look at a store's runs and snapshots.

rich is imported where a table is drawn, so ``--json`` and ``show`` never load it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import click

from burst.cli import UserFacingError
from burst.cli.options import json_option, open_existing, store_option, store_settings
from burst.cli.progress import transfer_bar
from burst.contract import Exit
from burst.errors import SnapshotError
from burst.snapshot import reader
from burst.snapshot.catalog import human_bytes, list_runs, snapshot_rows, unreadable
from burst.store import Store


@click.command("ls")
@click.argument("run_id", required=False)
@store_option
@store_settings
@json_option
def list_snapshots(run_id: str | None, store_url: str, settings: dict, as_json: bool) -> None:
    """List the runs in the store, or RUN_ID's complete snapshots, oldest first."""
    store = open_existing(store_url, **settings)
    if run_id is None:
        runs = list_runs(store)
        _print_runs(store.url, runs, as_json)
        exit_if_unreadable(runs)
        return
    rows = snapshot_rows(store, run_id)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    from rich.table import Table

    from burst.cli.console import cell, make_console

    table = Table(title=cell(f"snapshots of {run_id}"))
    for column in ("step", "epoch", "time", "size", "new bytes", "reason"):
        table.add_column(column, justify="left" if column in ("time", "reason") else "right")
    for row in rows:
        table.add_row(str(row["step"]), cell(row["epoch"]), cell(row["time"]),
                      human_bytes(row["bytes"]), human_bytes(row["new_bytes"]), cell(row["reason"]))
    make_console().print(table)


def _print_runs(where: str, runs: list[dict], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(runs, indent=1))
        return
    from burst.cli.console import cell, make_console, shown

    if not runs:
        click.echo(shown(f"no runs in {where}"))
        return
    from rich.table import Table

    table = Table(title=cell(f"runs in {where}"))
    for column in ("run", "snapshots", "newest step", "time", "reason"):
        table.add_column(column, justify="right" if column in ("snapshots", "newest step")
                         else "left")
    for run in runs:
        table.add_row(*run_cells(run))
    make_console().print(table)


def run_cells(run: dict) -> tuple[str, ...]:
    """A listed run's table cells; an unreadable run's reason cell says why."""
    from burst.cli.console import cell

    if run.get("error"):
        return (cell(run["run"]), str(run["snapshots"]), "?", "", cell(f"unreadable: "
                                                                         f"{run['error']}"))
    return (cell(run["run"]), str(run["snapshots"]), str(run["newest_step"]),
            cell(run["time"]), cell(run["reason"]))


def exit_if_unreadable(runs: list[dict]) -> None:
    """After the list is printed: one line naming the runs that could not be read, and
    ``Exit.RUNS_UNREADABLE``, so a script sees a short list without parsing it."""
    line = unreadable(runs)
    if line is not None:
        raise UserFacingError(line, Exit.RUNS_UNREADABLE)


@click.command("show")
@click.argument("run_id")
@click.option("--step", type=int, default=None, help="A snapshot's step (default: newest).")
@store_option
@store_settings
def show(run_id: str, step: int | None, store_url: str, settings: dict) -> None:
    """Print a snapshot's manifest (without its state tree) as JSON."""
    manifest = reader.read_manifest(open_existing(store_url, **settings), run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot")
    manifest = {k: v for k, v in manifest.items() if k not in ("state", "tensors")}
    click.echo(json.dumps(manifest, indent=1, sort_keys=True))


@click.command("verify")
@click.argument("run_id")
@click.option("--step", type=int, default=None, help="A snapshot's step (default: newest).")
@click.option("--all", "every", is_flag=True, help="Verify every snapshot of the run.")
@store_option
@store_settings
@json_option
def verify(run_id: str, step: int | None, every: bool, store_url: str, settings: dict,
           as_json: bool) -> None:
    """Check a snapshot's manifest and every blob's size and hash (reads every byte)."""
    store = open_existing(store_url, **settings)
    steps = reader.list_steps(store, run_id) if every else [step]
    if every and not steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    results = []
    with transfer_bar(f"verify {run_id}", enabled=not as_json) as progress:
        for one in steps:
            results.append(_verify_one(store, run_id, one, progress))
    if as_json:
        click.echo(json.dumps(results, indent=1))
    from burst.cli.console import shown

    for r in results if not as_json else ():
        if r["ok"]:
            click.echo(f"ok: {run_id} step {r['step']}: {r['blobs']} blobs, {r['tensors']} "
                       f"tensors, {human_bytes(r['bytes'])}")
        else:
            click.echo(shown(f"FAILED: {run_id} step {r['step']}: {r['error']}"))
    failed = [r for r in results if not r["ok"]]
    if failed:
        raise SnapshotError(f"{len(failed)} of {len(results)} snapshot(s) of {run_id!r} failed "
                            f"verification: {failed[0]['error']}")


def _verify_one(store: Store, run_id: str, step: int | None,
                progress: Callable[[int, int], None]) -> dict:
    try:
        manifest = reader.verify(store, run_id, step)
    except SnapshotError as exc:
        if step is None:
            raise
        return {"step": step, "ok": False, "error": str(exc)}
    size = sum(info["size"] for info in manifest["blobs"].values())
    progress(size, size)
    return {"step": manifest["step"], "blobs": len(manifest["blobs"]),
            "tensors": len(manifest["tensors"]), "bytes": size, "ok": True}


COMMANDS = (list_snapshots, show, verify)

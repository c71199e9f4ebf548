"""``burst ls``, ``burst show`` and ``burst verify``: look at a run's snapshots."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from burst import snapshot
from burst.cli.options import json_option, store_option
from burst.errors import SnapshotError
from burst.store import open_store


@click.command("ls")
@click.argument("run_id")
@store_option
@json_option
def list_snapshots(run_id: str, store_url: str, as_json: bool) -> None:
    """List the complete snapshots of RUN_ID, oldest first."""
    store = open_store(store_url)
    rows = [_summary(snapshot.read_manifest(store, run_id, step))
            for step in snapshot.list_steps(store, run_id)]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    table = Table(title=f"snapshots of {run_id}")
    for column in ("step", "epoch", "samples", "reason", "time", "size"):
        table.add_column(column, justify="right" if column in ("step", "epoch", "samples",
                                                               "size") else "left")
    for row in rows:
        table.add_row(str(row["step"]), str(row["epoch"]), str(row["samples_consumed"]),
                      row["reason"], row["time"], _human(row["bytes"]))
    Console().print(table)


@click.command("show")
@click.argument("run_id")
@click.option("--step", type=int, default=None, help="A snapshot's step (default: newest).")
@store_option
def show(run_id: str, step: int | None, store_url: str) -> None:
    """Print a snapshot's manifest (without its state tree) as JSON."""
    manifest = snapshot.read_manifest(open_store(store_url), run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot")
    manifest = {k: v for k, v in manifest.items() if k not in ("state", "tensors")}
    click.echo(json.dumps(manifest, indent=1, sort_keys=True))


@click.command("verify")
@click.argument("run_id")
@click.option("--step", type=int, default=None, help="A snapshot's step (default: newest).")
@click.option("--all", "every", is_flag=True, help="Verify every snapshot of the run.")
@store_option
def verify(run_id: str, step: int | None, every: bool, store_url: str) -> None:
    """Check a snapshot's manifest and every blob's size and hash."""
    store = open_store(store_url)
    steps = snapshot.list_steps(store, run_id) if every else [step]
    if every and not steps:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    for one in steps:
        manifest = snapshot.verify(store, run_id, one)
        click.echo(f"ok: {run_id} step {manifest['step']}: {len(manifest['blobs'])} blobs, "
                   f"{len(manifest['tensors'])} tensors, {_human(_bytes(manifest))}")


def _summary(manifest: dict | None) -> dict:
    assert manifest is not None
    counters = manifest.get("counters", {})
    return {"step": manifest["step"], "epoch": counters.get("epoch"),
            "samples_consumed": counters.get("samples_consumed"),
            "reason": manifest.get("reason", "?"), "time": manifest.get("time", "?"),
            "bytes": _bytes(manifest)}


def _bytes(manifest: dict) -> int:
    return sum(info["size"] for info in manifest["blobs"].values())


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


COMMANDS = (list_snapshots, show, verify)

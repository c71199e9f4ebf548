"""``burst status [RUN]``: where a run is, its newest snapshot, and what went wrong last.

rich loads only where a table is drawn, so ``--json`` never pays for it.
"""

from __future__ import annotations

import json

import click

from burst.cli.options import json_option, local_option, store_option
from burst.errors import BurstError
from burst.resume.status import run_status
from burst.snapshot.catalog import list_runs
from burst.store import is_local, open_store


@click.command("status")
@click.argument("run_id", required=False, envvar="BURST_RUN_ID")
@store_option
@local_option
@json_option
def status_command(run_id: str | None, store_url: str, local_url: str, as_json: bool) -> None:
    """Where RUN_ID is (local, a cluster, a host), its last snapshot and age, pending
    uploads, the last failure and the plan in force. Without RUN_ID: the store's runs."""
    store = open_store(store_url)
    if run_id is None:
        _print_runs(store.url, list_runs(store), as_json)
        return
    local = None
    if not is_local(store):
        try:
            local = open_store(local_url)
        except BurstError:
            local = None
    status = run_status(store, run_id, local)
    if as_json:
        click.echo(json.dumps(status, indent=1, default=str))
        return
    _print(status)


def _print_runs(where: str, runs: list[dict], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(runs, indent=1))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"runs in {where}"))
    for column in ("run", "snapshots", "newest step", "time", "reason"):
        table.add_column(column)
    for run in runs:
        table.add_row(escape(run["run"]), str(run["snapshots"]), str(run["newest_step"]),
                      str(run["time"]), str(run["reason"]))
    Console().print(table)


def _print(status: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"{status['run']} in {status['store']}"), show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    where = status["where"]
    table.add_row("where", escape(f"{where['place']}: {where['state']}"
                                  + (f" ({where['detail']})" if where.get("detail") else "")
                                  + (f" since {where['since']}" if where.get("since") else "")))
    snap = status["snapshot"]
    if snap:
        age = snap["age_seconds"]
        table.add_row("snapshot", escape(
            f"step {snap['step']} (epoch {snap['epoch']}, {snap['reason']}), "
            f"{_age(age)} ago{'' if snap['in_store'] else ', local only'}"))
    else:
        table.add_row("snapshot", "none")
    pending = status["pending_uploads"]
    table.add_row("pending uploads", ", ".join(map(str, pending)) if pending else "none")
    failure = status["last_failure"]
    table.add_row("last failure", escape(
        f"{failure['kind']} at step {failure['step']}: {failure['reason']} ({failure['time']})")
        if failure else "none")
    plan = status["plan"]
    table.add_row("plan in force", escape(", ".join(f"{k}={v}" for k, v in plan.items()))
                  if plan else "none")
    Console().print(table)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


COMMANDS = (status_command,)

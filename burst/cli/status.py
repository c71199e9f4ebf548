"""``burst status [RUN]``: where a run is, its newest snapshot, and what went wrong last.

rich loads only where a table is drawn, so ``--json`` never pays for it.
"""

from __future__ import annotations

import json

import click

from burst.cli.console import cell, human_age, make_console
from burst.cli.options import json_option, local_option, open_existing, store_option
from burst.cli.snapshots import exit_if_unreadable, run_cells
from burst.contract import ENV_RUN_ID
from burst.errors import BurstError
from burst.resume.status import intervals_line, run_status
from burst.snapshot.catalog import human_bytes, list_runs
from burst.store import is_local, open_store
from burst.supervise.coordinator import Claim, Coordinator


@click.command("status")
@click.argument("run_id", required=False, envvar=ENV_RUN_ID)
@store_option
@local_option
@json_option
@click.option("--watch", is_flag=True, help="A live view of RUN_ID: step, samples/s, loss, "
              "snapshot age, upload backlog, memory, where it runs, the last events.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between --watch updates.")
@click.option("--once", is_flag=True, help="Print one --watch update and exit.")
@click.option("--machine", is_flag=True, help="This machine's runs that share its GPU "
              "memory (burst run --gpu-memory-quota): quotas, priorities, who is paused.")
def status_command(run_id: str | None, store_url: str, local_url: str, as_json: bool,
                   watch: bool, interval: float, once: bool, machine: bool) -> None:
    """Where RUN_ID is (local, a cluster, a host), its last snapshot and age, pending
    uploads, the last failure and the plan in force. Without RUN_ID: the store's runs,
    and this machine's runs under quotas (only those with --machine)."""
    if machine:
        _print_machine(Coordinator().claims(), as_json)
        return
    store = open_existing(store_url)
    if run_id is None:
        if watch or once:
            raise click.UsageError("--watch needs a RUN_ID (or $BURST_RUN_ID)")
        runs = list_runs(store)
        _print_runs(store.url, runs, as_json)
        claims = [] if as_json else Coordinator().claims()
        if claims:
            _print_machine(claims, as_json)
        exit_if_unreadable(runs)
        return
    local = None
    if not is_local(store):
        try:
            local = open_store(local_url)
        except BurstError:
            local = None
    if watch or once:
        from burst.cli.watch import watch as live
        from burst.resume.live import live_view

        live(lambda: live_view(store, run_id, local), interval, once, as_json)
        return
    status = run_status(store, run_id, local)
    if as_json:
        click.echo(json.dumps(status, indent=1, default=str))
        return
    _print(status)


def _print_runs(where: str, runs: list[dict], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(runs, indent=1))
        return
    from rich.table import Table

    table = Table(title=cell(f"runs in {where}"))
    for column in ("run", "snapshots", "newest step", "time", "reason"):
        table.add_column(column)
    for run in runs:
        table.add_row(*run_cells(run))
    make_console().print(table)


def _print_machine(claims: list[Claim], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in claims], indent=1))
        return
    from rich.table import Table

    table = Table(title="runs sharing this machine's GPU memory")
    for column in ("run", "agent pid", "quota", "priority", "state"):
        table.add_column(column)
    for claim in claims:
        state = "pausing" if claim.pause_requested else claim.state
        table.add_row(cell(claim.run_id), str(claim.pid), human_bytes(claim.quota),
                      cell(claim.priority_name), cell(state))
    make_console().print(table)


def _print(status: dict) -> None:
    from rich.table import Table

    table = Table(title=cell(f"{status['run']} in {status['store']}"), show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    where = status["where"]
    table.add_row("where", cell(f"{where['place']}: {where['state']}"
                                  + (f" ({where['detail']})" if where.get("detail") else "")
                                  + (f" since {where['since']}" if where.get("since") else "")))
    snap = status["snapshot"]
    if snap:
        age = snap["age_seconds"]
        table.add_row("snapshot", cell(
            f"step {snap['step']} (epoch {snap['epoch']}, {snap['reason']}), "
            f"{human_age(age)} ago{'' if snap['in_store'] else ', local only'}"))
    else:
        table.add_row("snapshot", "none")
    if status.get("intervals"):
        table.add_row("intervals", cell(intervals_line(status["intervals"])))
    pending = status["pending_uploads"]
    table.add_row("pending uploads", cell(", ".join(map(str, pending))) if pending else "none")
    failure = status["last_failure"]
    table.add_row("last failure", cell(
        f"{failure['kind']} at step {failure['step']}: {failure['reason']} ({failure['time']})")
        if failure else "none")
    plan = status["plan"]
    table.add_row("plan in force", cell(", ".join(f"{k}={v}" for k, v in plan.items()))
                  if plan else "none")
    ready = status.get("readiness")
    table.add_row("readiness", cell(ready["line"]) if ready else "not published (no stager "
                  "ran: a run started before pre-staging, or it has not attached yet)")
    job = status.get("job")
    if job:
        state = (f"ended (exit {job['returncode']})" if job["ended"] else
                 f"detached: burst resume {status['run']} --attach follows it")
        table.add_row("ssh job", cell(f"{job['where']} (pid {job['pid']}), {state}"))
    make_console().print(table)




COMMANDS = (status_command,)

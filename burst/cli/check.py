"""``burst check [RUN] [--to ...]``: would a burst work right now? One row per part.

Exit 0 only when every required row passes (which are required: :mod:`burst.preflight.check`);
exit 1 otherwise, after printing every row, so one run shows everything to fix.
"""

from __future__ import annotations

import json

import click

from burst.cli.console import make_console
from burst.cli.options import (
    check_target,
    json_option,
    local_option,
    store_option,
    store_settings,
)
from burst.contract import ENV_OFFLINE, ENV_RUN_ID
from burst.preflight import check as preflight
from burst.preflight.clouds import DEFAULT_TIMEOUT
from burst.preflight.table import FAIL, OK, UNKNOWN, WARN, Report

NOT_READY = 1
STYLES = {OK: "green", FAIL: "red", WARN: "yellow", UNKNOWN: "magenta"}


def _targets(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
             ) -> tuple[str, ...]:
    """Each ``--to`` checked as ``burst resume`` checks its one."""
    return tuple(str(check_target(ctx, param, value)) for value in values)


@click.command("check")
@click.argument("run_id", required=False, envvar=ENV_RUN_ID)
@click.option("--to", multiple=True, metavar="WHERE", callback=_targets,
              help="Where a burst would go: skypilot (default), local, ssh://[user@]host[:port] "
                   "(repeatable).")
@store_option
@local_option
@store_settings
@click.option("--ssh-config", default=None, help="ssh: the SSH config file.")
@click.option("--identity", default=None, help="ssh: the private key.")
@click.option("--known-hosts", default=None, help="ssh: the known_hosts file.")
@click.option("--offline", is_flag=True, envvar=ENV_OFFLINE,
              help=f"Do not ask SkyPilot (its row is then unknown) and plan from the embedded "
                   f"card table (${ENV_OFFLINE}).")
@click.option("--plan-region", "plan_region", default="any", show_default=True,
              help="The region profile a burst would plan in, as burst resume --region "
                   "(beijing: also the image and the jobs controller a mainland burst needs).")
@click.option("--sky-timeout", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for SkyPilot's answer before calling it unknown.")
@json_option
def check_command(run_id: str | None, to: tuple[str, ...], store_url: str, local_url: str,
                  settings: dict, ssh_config: str | None, identity: str | None,
                  known_hosts: str | None, offline: bool, plan_region: str, sky_timeout: float,
                  as_json: bool) -> None:
    """Check that a burst would work now: store access, credentials, environment and
    wheelhouse, SkyPilot, SSH targets, a place to run and local disk.

    Each row passes, fails (with the fix) or is unknown (it could not be asked: offline,
    timed out); exit 0 only when every required row passes.

    \b
    Examples:
      burst check my-run --store s3://ckpt/runs
      burst check my-run --to ssh://me@gpu-box:22 --to local --json
      burst check my-run --store beijing --plan-region beijing
    """
    report = preflight.run(preflight.Request(
        store_url, local_url, run_id, to, settings, ssh_config, identity, known_hosts,
        offline=offline, sky_timeout=sky_timeout, region=plan_region))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        _print(report)
    if not report.ready:
        raise click.exceptions.Exit(NOT_READY)


def _print(report: Report) -> None:
    """A table on a terminal; one plain line per row otherwise (logs, pipes)."""
    console = make_console()
    if not console.is_terminal:
        for row in report.rows:
            click.echo(row.line())
        click.echo("ready" if report.ready else
                   f"not ready: {', '.join(r.name for r in report.blocking)}")
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="would a burst work now?")
    for column in ("", "check", "found", "fix"):
        table.add_column(column)
    for row in report.rows:
        style = STYLES.get(row.status)
        mark = f"[{style}]{row.mark}[/{style}]" if style else row.mark
        name = escape(row.name) + ("" if row.required else " [dim](optional)[/dim]")
        fix = escape(row.fix) if row.status in (FAIL, WARN, UNKNOWN) else ""
        table.add_row(mark, name, escape(row.detail), fix)
    console.print(table)
    console.print("[green]ready[/green]" if report.ready else
                  f"[red]not ready[/red]: {escape(', '.join(r.name for r in report.blocking))}")


COMMANDS = (check_command,)

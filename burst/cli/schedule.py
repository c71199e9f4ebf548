"""``burst schedule RUN --deadline T``: backups on a tightening cadence and an early burst.

Four ways to run it: in the foreground (a small daemon until the deadline), ``--once``
(one tick if one is due: what an installed timer runs), ``--install`` / ``--uninstall``
(a user crontab line or systemd timer), and ``--dry-run`` (the plan, touching nothing).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import asdict, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click

from burst import config as user_config
from burst import events
from burst.cli.options import check_target, json_option, local_option, store_option
from burst.deadline import policy as rules
from burst.deadline import scheduler as sched
from burst.deadline import timers as install_timer
from burst.deadline.handoff import DEFAULT_WAIT, Handoff
from burst.deadline.timespec import human, iso, parse_deadline, parse_duration, parse_instant
from burst.errors import ConfigError
from burst.preflight.check import for_schedule
from burst.snapshot import reader, sync
from burst.store import LocalStore, open_store
from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10


@click.command("schedule")
@click.argument("run_id")
@click.option("--deadline", "deadline_text", metavar="TIME",
              help="When the run must be done: ISO 8601 with a zone, e.g. 2026-12-03T18:00+08:00.")
@click.option("--every", "every_text", default="30m", show_default=True, metavar="DURATION",
              help="Backup gap while the deadline is far (30m, 2h, 1d).")
@click.option("--min-every", "floor_text", default="5m", show_default=True, metavar="DURATION",
              help="The shortest gap, reached as the deadline nears.")
@click.option("--total-steps", type=click.IntRange(min=1), default=None,
              help="The run's total optimizer steps (default: what its snapshots record).")
@click.option("--margin", "margin_text", default=None, metavar="DURATION",
              help="Time from deciding to burst to the first cloud step (default: estimated: "
                   "provisioning, environment install, upload and restore).")
@click.option("--cloud-speedup", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Assume the cloud runs this many times the local pace (default: the "
                   "planner's prediction for its first spot and on-demand card).")
@click.option("--gpu", "cards", multiple=True, metavar="NAME",
              help="Cards the planner may pick for the cloud pace (default: all).")
@click.option("--spot-recoveries", type=click.IntRange(min=0), default=1, show_default=True,
              help="Spot preemptions the slack must absorb before spot is used.")
@click.option("--window", "window_text", default="1h", show_default=True, metavar="DURATION",
              help="How far back the local pace is measured.")
@click.option("--burst-command", default=None, metavar="CMD",
              help="Run this to burst instead of `burst resume`; {run} and {tier} "
                   "(spot or on-demand) are filled in.")
@click.option("--to", default="skypilot", show_default=True, callback=check_target,
              help="Where a burst goes (`burst resume --to`): skypilot, ssh://host, local.")
@click.option("--no-burst", is_flag=True, help="Back up and advise only; never launch.")
@click.option("--local-run", type=click.Choice(rules.LOCAL_RUN_MODES), default=rules.LOCAL_STOP,
              show_default=True, help="After a burst, once the node took over: stop the local "
                                      "training (SIGTERM) or detach it (it runs on, fenced).")
@click.option("--dry-run", is_flag=True, help="Show the backups and decision points; act on "
                                              "nothing.")
@click.option("--once", is_flag=True, help="One tick if one is due, then exit (for timers).")
@click.option("--install", is_flag=True, help="Install a cron entry or systemd user timer.")
@click.option("--timer", type=click.Choice(install_timer.KINDS), default="auto",
              show_default=True, help="What --install writes.")
@click.option("--uninstall", is_flag=True, help="Remove what --install wrote for RUN.")
@store_option
@local_option
@json_option
def schedule_command(run_id: str, deadline_text: str | None, every_text: str, floor_text: str,
                     total_steps: int | None, margin_text: str | None,
                     cloud_speedup: float | None, cards: tuple[str, ...],
                     spot_recoveries: int, window_text: str, burst_command: str | None,
                     to: str, no_burst: bool, local_run: str, dry_run: bool, once: bool, install: bool, timer: str,
                     uninstall: bool, store_url: str, local_url: str, as_json: bool) -> None:
    """Keep RUN_ID backed up until a deadline, and burst to the cloud early if the local run
    will not finish in time (spot while slack remains, on-demand after).

    Every backup and decision is recorded in the run's events (see `burst status`)."""
    if uninstall:
        _uninstall(run_id, as_json)
        return
    modes = [flag for flag, on in (("--dry-run", dry_run), ("--once", once),
                                   ("--install", install)) if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be combined: choose one")
    if not deadline_text:
        raise ConfigError("--deadline is required, e.g. --deadline 2026-12-03T18:00+08:00")
    now = datetime.now(UTC)
    if once and parse_instant(deadline_text, what="deadline") <= now:
        click.echo(f"deadline {deadline_text} has passed: nothing to do; remove this schedule "
                   f"with `burst schedule {shlex.quote(run_id)} --uninstall`")
        return
    deadline = parse_deadline(deadline_text, now)
    every = parse_duration(every_text, what="--every")
    floor = min(parse_duration(floor_text, what="--min-every"), every)
    window = parse_duration(window_text, what="--window")
    margin = parse_duration(margin_text, what="--margin") if margin_text else None
    local, remote = _stores(run_id, local_url, store_url)
    history = sched.history_store(local, remote, run_id)
    policy = replace(_policy(local, run_id, deadline, margin, total_steps, cards,
                             cloud_speedup, spot_recoveries), local_run=local_run)
    observe = sched.observer(local, history, run_id, total_steps=total_steps, window=window)
    if dry_run:
        _preview(run_id, now, policy, observe(now), every, floor, remote, local, as_json)
        return
    if install:
        _install(run_id, timer, floor, deadline, local, remote, as_json)
        return
    scheduler = sched.Scheduler(
        run_id, policy, sched.SystemClock(), lambda: sched.backup(local, remote, run_id),
        observe, sched.recorder(history, run_id),
        burster=None if no_burst else _burster(burst_command, to, store_url, local_url),
        every=every, floor=floor, say=_say(deadline),
        flush=lambda: sync.copy_extras(local, remote, run_id),
        preflight=for_schedule(store_url, local_url, run_id, to),
        handoff=None if no_burst else _handoff(remote, run_id, local, once))
    _run(scheduler, history, run_id, once)


def _handoff(remote: Store, run_id: str, local: Store, once: bool) -> Handoff:
    """A timer's tick (``--once``) must not sit waiting for the node: it hands over at once
    (the local run, fenced by the node's first snapshot, then stops by itself)."""
    return Handoff(remote, run_id, local=local, wait=timedelta(0) if once else DEFAULT_WAIT)


def _stores(run_id: str, local_url: str, store_url: str) -> tuple[Store, Store]:
    local, remote = open_store(local_url), open_store(store_url)
    if local.url == remote.url:
        raise ConfigError(f"--store is the local tier itself ({local.url}): backups need "
                          "another store, e.g. --store s3://bucket/burst or --store oss://...")
    if not reader.list_steps(local, run_id) and not events.read(local, run_id):
        raise ConfigError(f"unknown run {run_id!r}: no snapshots or events in {local.url} "
                          "(check RUN_ID and --local)")
    return local, remote


def _policy(local: Store, run_id: str, deadline: datetime, margin: timedelta | None,
            total_steps: int | None, cards: tuple[str, ...], speedup: float | None,
            recoveries: int) -> rules.Policy:
    """The deadline policy: the margin from the newest snapshot's size (or --margin) and
    the cloud pace from the planner (or --cloud-speedup)."""
    manifest = reader.read_manifest(local, run_id)
    pace = sched.cloud_pace(local, run_id, total_steps=total_steps, cards=cards,
                            speedup=speedup, config=_config())
    return rules.Policy(deadline, sched.margin_for(manifest, margin), pace, recoveries)


def _config() -> dict[str, Any]:
    try:
        return user_config.load()
    except ConfigError:
        return {}


def _run(scheduler: sched.Scheduler, history: Store, run_id: str, once: bool) -> None:
    lock = install_timer.state_dir() / f"{install_timer.unit_name(run_id)}.lock"
    try:
        with sched.exclusive(lock):
            _run_locked(scheduler, history, run_id, once)
    except sched.Busy as busy:
        if not once:
            raise
        click.echo(f"{busy}: skipping this tick")


def _run_locked(scheduler: sched.Scheduler, history: Store, run_id: str, once: bool) -> None:
    if once:
        past = events.read(history, run_id)
        if sched.burst_done(past):
            click.echo(f"{run_id} already burst to the cloud: nothing to do")
            return
        if scheduler.run_once(sched.last_backup(past)) is None:
            click.echo("no backup due yet")
        return
    try:
        why = scheduler.run()
    except KeyboardInterrupt:
        scheduler.end("interrupted")
        raise SystemExit(130) from None
    click.echo(f"schedule for {run_id} ended: {why}")


def _say(deadline: datetime):
    def say(message: str) -> None:
        stamp = datetime.now(UTC).astimezone(deadline.tzinfo).strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"[{stamp}] {message}")

    return say


# -- bursting --------------------------------------------------------------------------------


def resume_args(run_id: str, spot: bool, to: str, store_url: str, local_url: str) -> list[str]:
    """The `burst resume` command a burst runs: only spot, or only on-demand, candidates."""
    return [sys.executable, "-m", "burst.cli", "resume", run_id, "--to", to,
            "--store", store_url, "--local", local_url, "--spot" if spot else "--no-spot"]


def _burster(template: str | None, to: str, store_url: str, local_url: str) -> sched.Burster:
    """The burst action: the user's --burst-command, else `burst resume` in a subprocess
    (its command line is the stable contract, so this does not import resume internals)."""

    def burst(run_id: str, spot: bool) -> int:
        tier = "spot" if spot else "on-demand"
        if template:
            command = template.format(run=shlex.quote(run_id), tier=tier)
            return subprocess.run(command, shell=True, check=False).returncode
        args = resume_args(run_id, spot, to, store_url, local_url)
        return subprocess.run(args, check=False).returncode

    return burst


# -- --dry-run -------------------------------------------------------------------------------


def _preview(run_id: str, now: datetime, policy: rules.Policy, progress: rules.Progress,
             every: timedelta, floor: timedelta, remote: Store, local: Store,
             as_json: bool) -> None:
    moments = sched.timeline(now, policy.deadline, every, floor)
    decision = rules.decide(progress, policy, now)
    latest = rules.burst_by(progress, policy)
    if as_json:
        click.echo(json.dumps({
            "run_id": run_id, "deadline": iso(policy.deadline), "store": remote.url,
            "local": local.url, "backups": [iso(m) for m in moments],
            "decision": decision.fields(), "cloud_source": policy.cloud.source,
            "burst_by": {k: iso(v) if v else None for k, v in latest.items()}}, indent=1))
        return
    zone = policy.deadline.tzinfo

    def at(moment: datetime) -> str:
        return iso(moment.astimezone(zone))

    click.echo(f"burst schedule {run_id}: dry run (nothing pushed, nothing launched)")
    click.echo(f"  deadline  {at(policy.deadline)} (in {human(policy.deadline - now)})")
    click.echo(f"  backups   {local.url} -> {remote.url}")
    click.echo(f"  progress  {_progress_line(progress)}")
    click.echo(f"  margin    {_margin_line(policy.margin)}")
    click.echo(f"  cloud     {policy.cloud.source}")
    click.echo(f"backups planned: {len(moments)}")
    for first, last, gap, count in sched.segments(moments):
        span = at(first) if count == 1 else f"{at(first)} .. {at(last)}"
        click.echo(f"  {span}  {count} x" + (f", every {human(gap)}" if count > 1 else ""))
    needed = decision.numbers.get("needed_steps_per_second")
    if needed is not None:
        click.echo(f"  pace needed to keep the margin: {needed:.3g} steps/s")
    click.echo(f"decision now: {decision.action}: {decision.reason}")
    for tier, moment in latest.items():
        if moment is not None:
            when = "already passed" if moment <= now else f"in {human(moment - now)}"
            click.echo(f"  if the local run stopped now, the last {tier.replace('_', '-')} "
                       f"burst that makes the deadline: {at(moment)} ({when})")


def _progress_line(progress: rules.Progress) -> str:
    total = progress.total_steps if progress.total_steps is not None else "?"
    pace = (f"{progress.steps_per_second:.3g} steps/s" if progress.steps_per_second
            else "no pace yet")
    stalled = f"; stalled: {progress.why_stalled}" if progress.stalled else ""
    return f"step {progress.step} of {total}, {pace}{stalled}"


def _margin_line(margin: rules.Margin) -> str:
    if margin.override_s is not None:
        return f"{human(margin.total_s)} (--margin)"
    return (f"{human(margin.total_s)} (provision {human(margin.provision_s)}, install "
            f"{human(margin.install_s)}, upload {human(margin.upload_s)}, restore "
            f"{human(margin.restore_s)})")


# -- --install / --uninstall -----------------------------------------------------------------


def _install(run_id: str, kind: str, floor: timedelta, deadline: datetime, local: Store,
             remote: Store, as_json: bool) -> None:
    params = click.get_current_context().params
    command = [sys.executable, "-m", "burst.cli", "schedule", run_id, "--once",
               "--store", _portable(params["store_url"], remote),
               "--local", _portable(params["local_url"], local),
               *_passthrough(click.get_current_context(), deadline)]
    done = install_timer.install(kind, run_id, command, floor, workdir=Path.cwd(),
                                 description=f"burst schedule for {run_id} until "
                                             f"{iso(deadline)}")
    if as_json:
        click.echo(json.dumps(asdict(done), indent=1))
        return
    click.echo(f"installed a {done.kind} schedule for {run_id} (every {human(floor)}, a backup "
               "when one is due):")
    if done.kind == "cron":
        click.echo(f"  crontab line:\n    {done.written[0]}")
        click.echo(f"  output goes to {install_timer.log_path(run_id)}")
    for path, text in done.contents.items():
        click.echo(f"  wrote {path}:")
        click.echo("".join(f"    {line}\n" for line in text.splitlines()), nl=False)
    for command_line in done.activated:
        click.echo(f"  ran: {command_line}")
    for command_line in done.manual:
        click.echo(f"  could not run, run it yourself: {command_line}")
    click.echo(f"remove it with: {done.remove}")


def _portable(text: str, store: Store) -> str:
    """A URL the installed job can use from any directory: local paths made absolute,
    anything else as the user wrote it (a named store keeps its config section)."""
    return store.url if isinstance(store, LocalStore) else text


def _passthrough(ctx: click.Context, deadline: datetime) -> list[str]:
    """The user's policy flags, for the installed command (paths made absolute by the store
    URLs; the deadline in its own zone)."""
    params = ctx.params
    args = ["--deadline", iso(deadline), "--every", params["every_text"],
            "--min-every", params["floor_text"], "--window", params["window_text"],
            "--spot-recoveries", str(params["spot_recoveries"]), "--to", params["to"]]
    optional = (("--total-steps", params["total_steps"]), ("--margin", params["margin_text"]),
                ("--cloud-speedup", params["cloud_speedup"]),
                ("--burst-command", params["burst_command"]))
    args += [word for flag, value in optional if value is not None for word in (flag, str(value))]
    args += [word for card in params["cards"] for word in ("--gpu", card)]
    return args + (["--no-burst"] if params["no_burst"] else [])


def _uninstall(run_id: str, as_json: bool) -> None:
    removed = install_timer.uninstall(run_id)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in removed], indent=1))
        return
    if not removed:
        click.echo(f"nothing installed for {run_id} (no crontab line, no systemd unit)")
        return
    for item in removed:
        for entry in item.written:
            what = "crontab line" if item.kind == "cron" else "file"
            click.echo(f"removed {what}: {entry}")
        for command_line in item.activated:
            click.echo(f"  ran: {command_line}")
        for command_line in item.manual:
            click.echo(f"  could not run, run it yourself: {command_line}")


COMMANDS = (schedule_command,)

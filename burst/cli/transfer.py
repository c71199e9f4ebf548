"""``burst push`` and ``burst pull``: move snapshots between the local tier and a store."""

from __future__ import annotations

import json
from typing import Literal

import click

from burst.cli.options import json_option, local_option, store_settings
from burst.cli.progress import transfer_bar
from burst.cli.wheels import describe_wheels, wheel_target, wheels_options
from burst.env import freeze, wheelhouse
from burst.env.lockfile import LockfileError
from burst.snapshot import sync
from burst.snapshot.catalog import human_bytes
from burst.store import Store, open_store


@click.command("push")
@click.argument("run_id")
@click.option("--store", "store_url", required=True, help="Where to push: s3://, oss://, ...")
@local_option
@click.option("--step", type=int, default=None, help="Push this snapshot (default: newest).")
@click.option("--all", "every", is_flag=True, help="Push every local snapshot.")
@wheels_options
@store_settings
@json_option
def push(run_id: str, store_url: str, local_url: str, step: int | None, every: bool,
         wheels: str | None, wheels_machine: str | None, torch_variant: str | None,
         settings: dict, as_json: bool) -> None:
    """Upload RUN_ID's snapshot(s) from the local tier; blobs already there are skipped.
    The run's wheelhouse follows (see --wheels): wheels already in the store are skipped."""
    local, remote = open_store(local_url), open_store(store_url, **settings)
    with transfer_bar(f"push {run_id}", enabled=not as_json) as progress:
        transfers = sync.push(local, remote, run_id, step, every=every, progress=progress)
    uploaded = _push_wheels(remote, run_id, wheels, wheels_machine, torch_variant, as_json)
    if as_json:
        click.echo(json.dumps([t.as_dict() for t in transfers], indent=1))
        return
    for t in transfers:
        click.echo(_line("pushed", t, remote.url))
    if uploaded is not False:
        click.echo(describe_wheels(uploaded))


def _push_wheels(remote: Store, run_id: str, policy: str | None, machine: str | None,
                 torch_variant: str | None, quiet: bool,
                 ) -> wheelhouse.Uploaded | Literal[False] | None:
    """The wheelhouse of the pushed run's lockfile; False when there is none to build."""
    try:
        lock, _ = freeze.load_frozen(remote, run_id)
    except LockfileError:
        return False
    target = wheel_target(remote, run_id, lock, policy, machine, torch_variant)
    if target is None:
        return False
    say = (lambda _line: None) if quiet else (lambda line: click.echo(line, err=True))
    return wheelhouse.ensure(remote, run_id, lock, target, say=say)


@click.command("pull")
@click.argument("run_id")
@click.option("--store", "store_url", required=True, help="Where to pull from.")
@local_option
@click.option("--step", type=int, default=None,
              help="Pull this snapshot (default: newest); older ones if it is damaged.")
@store_settings
@json_option
def pull(run_id: str, store_url: str, local_url: str, step: int | None, settings: dict,
         as_json: bool) -> None:
    """Download RUN_ID's newest intact snapshot, every blob hash-checked, into the local tier."""
    local, remote = open_store(local_url), open_store(store_url, **settings)
    with transfer_bar(f"pull {run_id}", enabled=not as_json) as progress:
        transfer = sync.pull(remote, local, run_id, step, progress=progress,
                             log=lambda msg: click.echo(f"warning: {msg}", err=True))
    if as_json:
        click.echo(json.dumps(transfer.as_dict(), indent=1))
        return
    click.echo(_line("pulled", transfer, local.url))


def _line(verb: str, t: sync.Transfer, where: str) -> str:
    if t.manifest == "present" and not t.bytes_sent:
        return f"{t.run_id} step {t.step}: already in {where}"
    speed = t.bytes_sent / t.seconds if t.seconds > 0 else 0.0
    return (f"{verb} {t.run_id} step {t.step} to {where}: {human_bytes(t.bytes_sent)} sent in "
            f"{t.blobs_sent} blobs ({human_bytes(int(speed))}/s), {human_bytes(t.bytes_skipped)} "
            f"already there")


COMMANDS = (push, pull)

"""``burst resume``: continue a run on another machine; ``burst node``: its node side."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from burst import config as user_config
from burst.cli.console import make_console
from burst.cli.options import (
    check_parses,
    gpu_counts,
    infra_list,
    local_option,
    split_csv,
    store_option,
)
from burst.cli.wheels import wheels_options
from burst.contract import ENV_OFFLINE, ENV_RUN_ID
from burst.env import wheelchoice
from burst.errors import BurstError
from burst.launch import STUB_ROOT_ENV, Launcher, Reporter, open_launcher
from burst.launch.skypilot import MODES
from burst.launch.ssh import SSHLauncher, Target
from burst.launch.task import NodeSoftware, spot_policy
from burst.node import restarts
from burst.plan import planner
from burst.resume import handoff as resume
from burst.resume import node, reach
from burst.resume import status as run_status
from burst.store import open_store


def _launcher(to: str, options: dict) -> Launcher:
    """The launcher ``--to`` names; an ssh:// URL that does not parse is a usage error."""
    if to.startswith("ssh://"):
        check_parses(to, "--to")
    return open_launcher(to, options)


def _request(run_id: str, options: dict, command: tuple[str, ...], dry_run: bool = False,
             say: Callable[[str], None] = print) -> resume.Request:
    spot = options["spot"]
    policy, why = spot_policy("first" if spot is None else ("only" if spot else "never"),
                              managed=options["mode"] != "cluster")
    if why:
        say(why)
    software = NodeSoftware(options["node_python"], options["burst_spec"] or resume.default_spec())
    return resume.Request(
        run_id=run_id, store_url=options["store_url"], local_url=options["local_url"],
        cards=split_csv(options["cards"], "--gpu"), region=options["region"],
        infra=infra_list(options["infra"]),
        counts=gpu_counts(options["counts"]), nodes=options["nodes"],
        options=planner.Options(margin=options["margin"], amp=options["amp"], spot=policy),
        micro_batch=options["micro_batch"], command=command, software=software,
        secrets=split_csv(options["secrets"], "--secret"), managed=options["mode"] != "cluster",
        max_restarts=options["max_restarts"],
        max_preemptions=options.get("max_preemptions", restarts.DEFAULT_MAX_PREEMPTIONS),
        preemption_hours=options.get("preemption_hours"),
        config=user_config.load(options["config_path"]),
        skypilot_catalog=not options["offline"] and not os.environ.get(ENV_OFFLINE),
        remote_node=options["to"] != "local", dry_run=dry_run,
        temporary_credentials=bool(options.get("allow_temporary_credentials")),
        private_endpoints=bool(options.get("allow_private_endpoints"))
        or _shares_network(str(options["to"])),
        to=str(options["to"]),
        wheels=wheelchoice.Choice(options.get("wheels"), options.get("wheels_machine"),
                                  options.get("torch_variant")),
    )


def _shares_network(to: str) -> bool:
    """An SSH box named by a loopback or private address is on this machine's network:
    what this machine reaches there, it reaches too."""
    return to.startswith("ssh://") and reach.address_kind(reach.host_of(to)) is not None


@click.command("resume", context_settings={"ignore_unknown_options": True})
@click.argument("run_id", required=False, envvar=ENV_RUN_ID)
@click.option("--to", default="skypilot", show_default=True,
              help="skypilot, ssh://[user@]host[:port], or local (the SkyPilot stub).")
@click.option("--gpu", "cards", multiple=True, metavar="NAME[,NAME]",
              help="Allowed cards (default: every card in the catalog).")
@click.option("--count", "counts", multiple=True, metavar="N[,N]", help="GPUs per node.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--region", default="any", show_default=True,
              help="Region profile: any, beijing, us, europe, or [regions.NAME] in the config.")
@click.option("--infra", multiple=True, metavar="INFRA", help="SkyPilot infra strings instead.")
@click.option("--spot/--no-spot", default=None,
              help="Only spot / only on-demand (default: spot first, then on-demand).")
@click.option("--amp", type=click.Choice(planner.AMP_POLICIES), default="auto", show_default=True)
@click.option("--margin", type=click.FloatRange(0, 1, min_open=True),
              default=planner.DEFAULT_MARGIN, show_default=True)
@click.option("--micro-batch", type=click.IntRange(min=1), default=None,
              help="Force this micro-batch (the global batch never changes).")
@click.option("--mode", type=click.Choice(MODES), default="jobs", show_default=True,
              help="skypilot: a managed job with recovery, or a cluster with autostop.")
@click.option("--cluster", default=None, help="skypilot cluster mode: the cluster's name.")
@click.option("--idle-minutes", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--keep", is_flag=True,
              help="Cluster mode: keep the cluster when the run ends (idle only stops it).")
@click.option("--max-restarts", type=click.IntRange(min=0),
              default=restarts.DEFAULT_MAX_RESTARTS, show_default=True,
              help="Managed jobs: restarts after errors (GPU failures) before burst stops "
                   "the job; counted in the store.")
@click.option("--max-preemptions", type=click.IntRange(min=0),
              default=restarts.DEFAULT_MAX_PREEMPTIONS, show_default=True,
              help="Managed jobs: preemptions before burst stops the job (apart from errors).")
@click.option("--preemption-hours", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Managed jobs: stop recovering preemptions once the job is this many hours "
                   "old (a time budget; default: none).")
@click.option("--secret", "secrets", multiple=True, metavar="NAME",
              help="Also pass this environment variable to the node as a secret.")
@click.option("--node-python", default=None,
              help="Development/prepared nodes: the node already has burst and the "
                   "environment at this interpreter (checked, not installed; no wheelhouse).")
@click.option("--burst-spec", default=None,
              help="What the node asks a forwarded package mirror for when the wheelhouse "
                   "holds no burst wheel.")
@click.option("--allow-temporary-credentials", is_flag=True,
              help="Forward store keys that carry a session token (they expire mid-run; "
                   "warned about). Default: refused.")
@click.option("--allow-private-endpoints", is_flag=True,
              help="Forward loopback, link-local and private store endpoints and mirrors "
                   "to a remote node (one that shares this network). Default: refused.")
@click.option("--ssh-config", default=None, help="ssh: the SSH config file.")
@click.option("--identity", default=None, help="ssh: the private key.")
@click.option("--known-hosts", default=None, help="ssh: the known_hosts file.")
@click.option("--accept-new-host", is_flag=True,
              help="ssh: trust a host not in known_hosts (its key is saved there).")
@click.option("--attach", is_flag=True,
              help="ssh: re-attach to the run's detached job (tail it to its end) instead "
                   "of launching.")
@click.option("--remote-dir", default=None, help="ssh: where node directories go.")
@click.option("--stub-root", default=None, help=f"local: node directories (${STUB_ROOT_ENV}).")
@click.option("--stub-system", default=None, metavar="DIR",
              help="local: the sealed node's system root, another distribution's "
                   "(debootstrap; $BURST_STUB_SYSTEM). Default: this machine's.")
@click.option("--stub-fail-first", type=click.IntRange(min=0), default=0,
              help="local: refuse the first K candidates for capacity.")
@click.option("--stub-preempt-at", type=click.IntRange(min=1), default=None,
              help="local: preempt the job at this optimizer step.")
@click.option("--stub-preempt", type=click.Choice(["term", "kill"]), default="term")
@click.option("--stub-fault", "stub_faults", multiple=True, metavar="SPEC",
              help="local: the BURST_FAULT of each attempt in turn (term@N: a preemption "
                   "notice, kill@N: the machine taken, sticky@N: a GPU failure).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None)
@click.option("--offline", is_flag=True, help="Embedded card table only (no SkyPilot catalog).")
@click.option("--dry-run", is_flag=True, help="Plan, render, validate, print; launch nothing.")
@wheels_options
@store_option
@local_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def resume_command(run_id: str | None, command: tuple[str, ...], dry_run: bool,
                   **options: object) -> None:
    """Continue RUN_ID elsewhere from its newest snapshot: burst resume RUN --to local
    [-- python train.py ...] (default command: the one the agent last ran)."""
    if not run_id:
        raise click.UsageError("give a RUN_ID (or set $BURST_RUN_ID)")
    console = make_console(stderr=True)
    if options.get("attach"):
        sys.exit(run_attach(run_id, options, console))
    launcher = _launcher(str(options["to"]), options)

    def say(message: str) -> None:
        console.print(f"burst: {escape(message)}")

    request = _request(run_id, options, command, dry_run, say)
    prepared = resume.prepare(request, say=say)
    show(prepared, launcher, console)
    if dry_run:
        console.print("[bold]dry run:[/bold] nothing launched")
        return
    sys.exit(run_launch(prepared, launcher, console))


def run_launch(prepared: resume.Prepared, launcher: Launcher, console: Console) -> int:
    """Launch and stream; the job's own exit code (86, 87, 88, 0 from its nodes' events,
    not the launcher's status: SkyPilot's is 0 or 100) becomes ours."""
    report = Reporter(say=lambda m: console.print(f"burst: {escape(m)}"),
                      output=lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    since = run_status.now()
    result = resume.launch(prepared, launcher, report)
    code = run_status.job_ended_with(prepared.store, prepared.request.run_id, since,
                                     result.returncode)
    state = "finished" if code == 0 else f"ended with exit {code}"
    said = "" if code == result.returncode else f" ({launcher.kind} said {result.returncode})"
    console.print(f"burst: run {escape(prepared.request.run_id)} {state} at "
                  f"{escape(result.where)}{escape(said)}")
    return code


def run_attach(run_id: str, options: dict, console: Console) -> int:
    """Tail the run's detached SSH job to its end; its exit code becomes ours."""

    def ssh(url: str) -> SSHLauncher:
        target = Target.parse(url, options.get("ssh_config"), options.get("identity"),
                              options.get("known_hosts"))
        return SSHLauncher(target, accept_new_host=bool(options.get("accept_new_host")))

    report = Reporter(say=lambda m: console.print(f"burst: {escape(m)}"),
                      output=lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    result = resume.attach(open_store(str(options["store_url"])), run_id, ssh, report)
    state = "finished" if result.returncode == 0 else f"ended with exit {result.returncode}"
    console.print(f"burst: run {escape(run_id)} {state} at {escape(result.where)}")
    return result.returncode


def show(prepared: resume.Prepared, launcher: Launcher, console: Console) -> None:
    """The plan, the environment record, the rendered task and the exact commands."""
    request = prepared.request
    if prepared.pushed is not None:
        console.print(f"pushed local snapshot at step {prepared.pushed}")
    env = prepared.environment
    console.print(f"[bold]resume[/bold] {escape(request.run_id)} from step {prepared.step} "
                  f"in {escape(prepared.store.url)} -> {escape(launcher.kind)}")
    console.print(f"environment: lockfile {str(env.get('lockfile'))[:12]}, python "
                  f"{env.get('python')}, torch {env.get('torch')}, code "
                  f"{str(env.get('code'))[:12]}")
    if env.get("node_python"):
        console.print(f"node python: {escape(str(env['node_python']))}")
    if env.get("wheelhouse"):
        console.print(f"wheelhouse: {escape(str(env['wheelhouse']))}")
    table = Table(title="candidates, in failover order")
    for column in ("#", "card", "GPUs", "where", "spot", "micro", "accum", "AMP", "$/h"):
        table.add_column(column)
    for index, plan in enumerate(prepared.candidates, 1):
        target = plan.target
        price = plan.price_per_hour
        table.add_row(str(index), target.card.name, f"{target.count}x{target.nodes}",
                      escape(target.place.label), "yes" if target.spot else "no",
                      str(plan.micro_batch), str(plan.accumulation), plan.amp or "fp32",
                      "?" if price is None else f"{price:.2f}")
    console.print(table)
    for warning in prepared.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    checked = prepared.task.checked_by
    console.print("[bold]task[/bold] " + (
        f"(validated with sky.Task.from_yaml_str, SkyPilot in {escape(checked)}):" if checked
        else "(not checked: SkyPilot is not installed here):"))
    click.echo(prepared.task.yaml)
    console.print("[bold]commands[/bold]:")
    for line in launcher.describe(prepared.task, sorted(prepared.secrets)):
        click.echo(f"  {line}")


def agent_launcher(store_url: str, local_url: str, to: str) -> Callable[[str], int]:
    """What ``burst run --on-oom burst`` calls: a resume with the defaults, to ``to``."""

    def launch(run_id: str) -> int:
        console = make_console(stderr=True)
        options = {"to": to, "store_url": store_url, "local_url": local_url, "cards": (),
                   "region": "any", "infra": (), "counts": (), "nodes": 1, "spot": None,
                   "margin": planner.DEFAULT_MARGIN, "amp": "auto", "micro_batch": None,
                   "node_python": os.environ.get("BURST_NODE_PYTHON"), "burst_spec": None,
                   "secrets": (), "mode": "jobs", "config_path": None,
                   "max_restarts": restarts.DEFAULT_MAX_RESTARTS,
                   "offline": bool(os.environ.get(ENV_OFFLINE))}
        try:
            launcher = _launcher(to, options)
            prepared = resume.prepare(_request(run_id, options, ()),
                                      say=lambda m: console.print(f"burst: {escape(m)}"))
            return run_launch(prepared, launcher, console)
        except BurstError as error:
            console.print(f"burst: resume failed: {escape(str(error))}")
            return error.exit_code

    return launch


# -- the node side --------------------------------------------------------------------------


@click.group("node")
def node_group() -> None:
    """What a resumed run's task runs on its node (set up by burst resume)."""


def _software(python: str | None, venv: Path | None) -> tuple[str | None, Path]:
    base = node.node_dir()
    return python, (venv or base / "venv")


@node_group.command("setup")
@click.option("--python", default=None, help="Use this interpreter's environment (checked).")
@click.option("--venv", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Install the run's environment here (default $BURST_NODE_DIR/venv).")
@click.option("--code-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Restore the code here (default $BURST_NODE_DIR/code).")
def node_setup(python: str | None, venv: Path | None, code_dir: Path | None) -> None:
    """Restore the run's code and build (or check) its environment."""
    run_id, store_url = node.run_identity()
    python, venv_dir = _software(python, venv)
    node.setup(run_id, open_store(store_url), python=python, venv=venv_dir,
               code_dir=code_dir or node.node_dir() / "code",
               say=lambda m: click.echo(f"burst node: {m}", err=True))


@node_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--python", default=None, help="The environment's interpreter.")
@click.option("--venv", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def node_run(python: str | None, venv: Path | None, command: tuple[str, ...]) -> None:
    """Pull, check, re-plan for this card, and train: burst node run -- python train.py"""
    run_id, store_url = node.run_identity()
    python, venv_dir = _software(python, venv)
    code = node.run(command, run_id, store_url, python=python, venv=venv_dir,
                    local_dir=node.node_dir() / "local",
                    say=lambda m: click.echo(f"burst node: {m}", err=True))
    sys.exit(code)


COMMANDS = (resume_command, node_group)

"""``burst run`` and ``burst drill``: supervise a training command, or rehearse a failure."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from burst import events
from burst.cli.options import check_target, json_option, local_option, store_option
from burst.contract import ENV_LOCAL, ENV_RUN_ID
from burst.errors import ConfigError
from burst.inputs.names import INPUTS_ENV
from burst.inputs.selection import declared_value
from burst.store import is_local, open_store
from burst.supervise.agent import STORE_WAIT_CAP, Agent, Outcome, Policy
from burst.supervise.coordinator import (
    Coordinator,
    Share,
    machine_capacity,
    parse_priority,
    parse_size,
    poll_seconds,
)
from burst.supervise.exporter import Exporter
from burst.supervise.gpuwatch import GpuWatch
from burst.supervise.scale_policy import ScaleMonitor
from burst.supervise.scale_policy import parse as parse_scale_out
from burst.training.faults import parse as parse_faults


def supervision_options(fn):
    for option in reversed((
        click.option("--run-id", envvar=ENV_RUN_ID, required=True,
                     help="The run to supervise (also given to the child as $BURST_RUN_ID)."),
        store_option,
        local_option,
        click.option("--on-oom", type=click.Choice(["retry-smaller", "burst", "stop"]),
                     default="retry-smaller", show_default=True),
        click.option("--on-gpu-failure", type=click.Choice(["burst", "restart", "stop"]),
                     default="burst", show_default=True),
        click.option("--on-killed", type=click.Choice(["restart", "stop"]), default="stop",
                     show_default=True, help="After SIGKILL or a segfault."),
        click.option("--burst-to", default=None, metavar="TARGET", callback=check_target,
                     help="Where the 'burst' policy resumes the run (burst resume --to: "
                          "skypilot, ssh://user@host, local); unset: print the command."),
        click.option("--max-retries", type=click.IntRange(0), default=3, show_default=True),
        click.option("--backoff", type=click.IntRange(2), default=2, show_default=True,
                     help="Divide the micro-batch by this on each OOM retry."),
        click.option("--store-retries", type=click.IntRange(0), default=5, show_default=True,
                     help="Start again this often when the store is unreachable as the run "
                          "starts (exit 92: nothing trained), apart from --max-retries."),
        click.option("--store-wait", type=click.FloatRange(min=0), default=15.0,
                     show_default=True, help="Seconds before the first such start, doubled "
                                             f"each time (at most {STORE_WAIT_CAP:g})."),
        click.option("--gpu-interval", type=click.FloatRange(min=0.1), default=30.0,
                     show_default=True, help="Seconds between GPU samples."),
        click.option("--memory-threshold", type=click.FloatRange(0, 1), default=0.8,
                     show_default=True, help="Memory alert threshold (fraction of the card)."),
        click.option("--memory-sustain", type=click.FloatRange(min=0), default=300.0,
                     show_default=True, help="Seconds above the threshold before alerting."),
        click.option("--scale-out", default=None, metavar="RULE",
                     help='Ask for another node when memory stays high, e.g. "memory > 80% '
                          'for 5m: +1 node, max 4" (also: min N, settle 10m); recorded as '
                          'scale-request events.'),
        click.option("--gpu-memory-quota", default=None, metavar="SIZE",
                     help="Cap the child's GPU memory (e.g. 40GiB) and share the machine "
                          "with other burst runs: see --priority and burst status --machine."),
        click.option("--priority", type=click.Choice(["high", "normal", "low"]),
                     default="normal", show_default=True,
                     help="With --gpu-memory-quota: lower-priority runs pause (snapshot, "
                          "wait, resume exactly) when a higher one needs their memory."),
        click.option("--input", "inputs", multiple=True, metavar="PATH",
                     help="A file, folder or s3://, oss://, gs:// URL the run reads "
                          "(repeatable): it travels to a resumed run's node (besides the "
                          "files burst sees the run read)."),
        click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED),
    )):
        fn = option(fn)
    return fn


def build_agent(options: dict, fault: str | None = None, json_output: bool = False) -> Agent:
    store = open_store(options["store_url"])
    history = store if is_local(store) else open_store(options["local_url"])
    policy = Policy(on_oom=options["on_oom"], on_gpu_failure=options["on_gpu_failure"],
                    on_killed=options["on_killed"], max_retries=options["max_retries"],
                    backoff=options["backoff"], store_retries=options["store_retries"],
                    store_wait=options["store_wait"])
    run_id = options["run_id"]
    scale_rule = options.get("scale_out")
    policy_out = parse_scale_out(scale_rule) if scale_rule else None  # before anything starts

    def record(name: str, /, **fields: Any) -> None:
        events.record(history, run_id, name, source="agent", **fields)

    watch = GpuWatch(record, interval=options["gpu_interval"],
                     threshold=options["memory_threshold"],
                     sustain_s=options["memory_sustain"],
                     scale=None if policy_out is None else ScaleMonitor(policy_out, record))
    launcher = None
    if options.get("burst_to"):
        from burst.cli.resume import agent_launcher

        launcher = agent_launcher(options["store_url"], options["local_url"],
                                  options["burst_to"])
    return Agent(list(options["command"]), run_id=run_id, store=history,
                 store_url=options["store_url"], policy=policy, watch=watch, fault=fault,
                 launcher=launcher,
                 env={ENV_LOCAL: options["local_url"], **declared_inputs(options)},
                 say=lambda msg: click.echo(f"burst: {msg}", err=True),
                 child_stdout=sys.stderr if json_output else None,
                 share=machine_share(options))


def declared_inputs(options: dict) -> dict[str, str]:
    """``--input`` paths for the training process (absolute: it may change directory)."""
    paths = [p if "://" in p else os.path.abspath(os.path.expanduser(p))
             for p in options.get("inputs") or ()]
    return {INPUTS_ENV: declared_value(paths)} if paths else {}


def machine_share(options: dict) -> Share | None:
    """The claim on this machine's GPU memory asked for, if any."""
    if not options.get("gpu_memory_quota"):
        if options.get("priority", "normal") != "normal":
            raise ConfigError("--priority needs --gpu-memory-quota")
        return None
    return Share(Coordinator(capacity=machine_capacity()),
                 parse_size(options["gpu_memory_quota"]), parse_priority(options["priority"]),
                 poll=poll_seconds())


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Export Prometheus metrics (GPU, step time, loss, batch, snapshots, "
                   "failures) on this port while the run is supervised.")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True,
              help="Address the metrics server binds to.")
@supervision_options
def run_command(metrics_port: int | None, metrics_addr: str, **options: object) -> None:
    """Supervise a training command: burst run --run-id R -- python train.py ...

    The child's OOM, GPU failure, SIGTERM/SIGINT or crash is classified from its exit
    status and handled by the policies below.
    """
    agent = build_agent(options)
    with exporting(agent, metrics_port, metrics_addr):
        outcome = agent.run()
    _finish(outcome)


@contextlib.contextmanager
def exporting(agent: Agent, port: int | None, addr: str) -> Iterator[None]:
    """Serve the run's metrics while ``agent`` runs (no port: none); the child learns
    where to publish its figures."""
    if port is None:
        yield
        return
    try:
        exporter = Exporter(agent.run_id, port, addr, watch=agent.watch, agent=agent)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
                          ) from None
    agent.env.update(exporter.env)
    click.echo(f"burst: metrics on http://{addr}:{port}/metrics", err=True)
    try:
        yield
    finally:
        exporter.close()


@click.command("drill", context_settings={"ignore_unknown_options": True})
@click.option("--fault", required=True,
              help="KIND@STEP, optionally with :MICRO and /RANK: oom, oom-optimizer, sticky, kill "
                   "or term at that step (in micro-batch MICRO; on rank RANK only).")
@json_option
@supervision_options
def drill(fault: str, as_json: bool, **options: object) -> None:
    """Run a training command under an injected fault and report what was lost."""
    injected = parse_faults(fault)
    if len(injected) != 1:
        raise ConfigError("a drill injects exactly one fault")
    agent = build_agent(options, fault=fault, json_output=as_json)
    outcome = agent.run()
    report = drill_report(agent.store, agent.run_id, injected[0].step, injected[0].kind, outcome)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(_drill_summary(fault, report))
    _finish(outcome)


def _drill_summary(fault: str, report: dict) -> str:
    if report["resumed_from_step"] is None:
        return f"fault {fault}: not resumed here; outcome: {report['outcome']}"
    return (f"fault {fault}: resumed from step {report['resumed_from_step']}, "
            f"{report['steps_lost']} step(s) of work lost; outcome: {report['outcome']}")


def drill_report(store, run_id: str, fault_step: int, kind: str, outcome: Outcome) -> dict:
    """Work lost = steps completed before the fault minus the step training resumed from."""
    resumes = [e for e in events.read(store, run_id) if e.get("event") == "resume"]
    resumed = resumes[-1]["step"] if resumes else None
    completed = fault_step - 1
    return {"fault": kind, "fault_step": fault_step, "resumed_from_step": resumed,
            "steps_lost": None if resumed is None else completed - resumed,
            "attempts": len(outcome.attempts), "outcome": outcome.decision,
            "returncode": outcome.returncode}


def _finish(outcome: Outcome) -> None:
    if outcome.message:
        click.echo(f"burst: {outcome.message}", err=True)
    sys.exit(outcome.returncode)


COMMANDS = (run_command, drill)

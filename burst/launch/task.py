"""The SkyPilot task a resume launches, rendered from ``templates/`` and checked by SkyPilot.

Every launcher runs this one rendered YAML (SkyPilot hands it to the cloud, the ``ssh``
launcher and the local stub run its ``setup`` and ``run`` themselves), so what the tests
exercise is what the cloud runs.

What goes where, and why:

- ``resources.ordered``: the planner's fitting candidates in its failover order (every spot
  entry, then every on-demand one); SkyPilot tries them in that order.
- ``job_recovery``: for managed jobs, ``EAGER_NEXT_REGION`` (a preempted spot job is
  relaunched from the top of the ordered list rather than waiting where capacity just
  vanished), and the exit codes where a new node helps: a sticky GPU failure (87) and the
  clean stop after a preemption notice (88: it can end the job before the cloud takes
  the machine, and the controller, finding the cluster still up, would judge it by its
  exit code). SkyPilot recovers those codes, and preemptions, without counting them
  against ``max_restarts_on_errors``; so that is 0 (an OOM is re-planned on the node and
  then ends the job with 86; a script error would fail the same way again), and burst
  bounds the restarts itself, errors and preemptions apart: ``BURST_MAX_RESTARTS`` and
  ``BURST_MAX_PREEMPTIONS`` in the envs, counted by the nodes in the store
  (:mod:`burst.node.restarts`).
- ``setup``: a step that fails along the way (a flaky GET) is retried in place a few
  times; the last failure ends with 91 (:attr:`burst.contract.Exit.SETUP_FAILED`), what the user must
  fix with 2 at once.
- cluster mode (``managed`` False) has no recovery, so it never renders a spot candidate:
  a preempted cluster would simply be gone.
- ``envs``: the run id, the store URL and its non-secret settings, the plan policy, the
  lockfile digest and its Python (``BURST_LOCKFILE_DIGEST``, ``BURST_PYTHON``) and the
  package mirrors forwarded as a fallback.
- ``secrets``: credential *names* only, with null values. The values are handed to the
  SDK at launch (:func:`load`) and never written to a file or printed.
- ``setup``: :mod:`burst.node.bootstrap`, embedded as a heredoc (it must run before
  anything is installed, and the node has nothing of this machine's), puts burst into the
  node's one venv from the run's wheelhouse in the store; ``burst node setup`` from that
  venv restores the code and installs the rest of the lockfile into it.
- ``run``: from ``code/<cwd>``, the working directory the code archive recorded, so the
  entry point's paths (made relative to it at resume time) resolve on the node.

The rendered YAML names no path of this machine.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from burst.contract import ENV_TEMPLATES, Exit
from burst.errors import ConfigError
from burst.launch import skyenv
from burst.node.restarts import (
    DEFAULT_MAX_PREEMPTIONS,
    DEFAULT_MAX_RESTARTS,
    MAX_PREEMPTIONS_ENV,
    MAX_RESTARTS_ENV,
    PREEMPTION_HOURS_ENV,
)
from burst.plan.planner import Plan

# The store's private CA certificate (PEM text: public, not a secret). The task carries
# the text, the node writes it to a file and points BURST_CA_BUNDLE there: a path of the
# launching machine would mean nothing on the node.
CA_BUNDLE_ENV = "BURST_CA_BUNDLE_PEM"
CA_BUNDLE_LIMIT = 64 * 1024  # a private CA is a few KiB; a whole system bundle is not
SINGLE, MULTI = "task.yaml.j2", "task-multinode.yaml.j2"
# Only what a new machine fixes: a sticky GPU failure (87), and the clean exit after a
# preemption notice (88), which can beat the cloud's reclaim past the controller's 5-second
# recheck (the cluster still UP: judged by exit code, it would end the job FAILED). Never
# OOM (86): these codes bypass max_restarts_on_errors and EAGER_NEXT_REGION relaunches from
# the top of the list, the same card again, forever. burst bounds both itself
# (burst.node.restarts: errors and preemptions apart).
RECOVER_ON = (Exit.GPU_FAILURE, Exit.STOPPED)
SETUP_ATTEMPTS = 3  # the setup's steps (bootstrap, burst node setup) on a failure along the way
SETUP_BACKOFF = 10  # seconds before the second attempt; twice that before the third
SKYPILOT_MAX_RESTARTS = 0  # SkyPilot retries nothing else; burst bounds the restarts
INSTALLED_BURST = '"$BURST_NODE_DIR/venv/bin/burst"'
BOOTSTRAP_END = "BURST_BOOTSTRAP_END"  # the heredoc's terminator: no line of the file


@dataclass(frozen=True)
class NodeSoftware:
    """How the node gets burst and the run's environment.

    ``python`` None (the normal path): the bootstrap installs burst into the node's venv
    from the run's wheelhouse, then ``burst node setup`` the rest of the lockfile.
    ``python`` set (a development override, ``--node-python``): the node already has an
    environment at that interpreter (a prepared image, a lab box); it is checked against
    the lockfile instead. ``burst_spec``: what pip asks a forwarded mirror for when the
    wheelhouse holds no burst wheel.
    """

    python: str | None = None
    burst_spec: str = ""

    @property
    def burst(self) -> str:
        if self.python:
            return f"{shlex.quote(self.python)} -m burst.cli"
        return INSTALLED_BURST

    @property
    def node_flags(self) -> str:
        return f" --python {shlex.quote(self.python)}" if self.python else ""


@dataclass(frozen=True)
class TaskSpec:
    """Everything a rendered task says, as plain values."""

    run_id: str
    step: int
    reason: str
    name: str
    candidates: Sequence[Plan]
    entry_point: Sequence[str]
    envs: Mapping[str, str]
    secret_names: Sequence[str] = ()
    software: NodeSoftware = field(default_factory=NodeSoftware)
    managed: bool = True
    max_restarts: int = DEFAULT_MAX_RESTARTS  # managed jobs: burst's bound (BURST_MAX_RESTARTS)
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS  # ... on preemptions, apart from errors
    preemption_hours: float | None = None  # ... a wall-time budget for a preempted job
    workdir: str = "."  # where the node runs, relative to the restored code

    @property
    def num_nodes(self) -> int:
        return self.candidates[0].target.nodes if self.candidates else 1


@dataclass(frozen=True)
class RenderedTask:
    """The YAML text and what the launchers need from it (parsed back, not re-derived)."""

    yaml: str
    config: dict[str, Any]
    secret_names: tuple[str, ...]
    checked_by: str | None = None  # where SkyPilot's parser ran; None: not installed

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def envs(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.config.get("envs") or {}).items()}

    @property
    def num_nodes(self) -> int:
        return int(self.config.get("num_nodes") or 1)

    @property
    def candidates(self) -> list[dict[str, Any]]:
        return list((self.config.get("resources") or {}).get("ordered") or [])

    @property
    def job_recovery(self) -> dict[str, Any] | None:
        return (self.config.get("resources") or {}).get("job_recovery")

    @property
    def setup(self) -> str:
        return str(self.config.get("setup") or "")

    @property
    def run(self) -> str:
        return str(self.config.get("run") or "")


def template_dir() -> Path:
    """``$BURST_TEMPLATES``, else the templates shipped in the package (``templates/`` at
    the top of the repository is a link to them)."""
    explicit = os.environ.get(ENV_TEMPLATES)
    path = Path(explicit) if explicit else Path(__file__).resolve().parents[1] / "templates"
    if not (path / SINGLE).is_file():
        raise ConfigError(f"the SkyPilot task templates are not in {path}: set "
                          f"${ENV_TEMPLATES} to the directory holding {SINGLE}")
    return path


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir()),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["shquote"] = shlex.quote
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


def resource_entry(plan: Plan) -> dict[str, Any]:
    """One ``resources.ordered`` entry for a candidate."""
    target = plan.target
    return {"accelerators": f"{target.card.name}:{target.count}", "infra": target.place.infra,
            "use_spot": target.spot, "image_id": target.place.image_id}


def job_recovery(spec: TaskSpec) -> dict[str, Any] | None:
    if not spec.managed:
        return None
    return {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": SKYPILOT_MAX_RESTARTS,
            "recover_on_exit_codes": [int(code) for code in RECOVER_ON]}


def task_envs(spec: TaskSpec) -> dict[str, str]:
    """The spec's envs, and for a managed job the restart bound its nodes enforce."""
    if not spec.managed:
        return dict(spec.envs)
    if spec.max_restarts < 0 or spec.max_preemptions < 0:
        raise ConfigError(f"the restart bounds must be >= 0, got {spec.max_restarts} and "
                          f"{spec.max_preemptions}")
    if spec.preemption_hours is not None and not spec.preemption_hours > 0:
        raise ConfigError(f"the preemption budget must be > 0 hours, got "
                          f"{spec.preemption_hours}")
    bounds = {MAX_RESTARTS_ENV: str(spec.max_restarts),
              MAX_PREEMPTIONS_ENV: str(spec.max_preemptions)}
    if spec.preemption_hours is not None:
        bounds[PREEMPTION_HOURS_ENV] = f"{spec.preemption_hours:g}"
    return {**spec.envs, **bounds}


def spot_policy(spot: str, managed: bool) -> tuple[str, str | None]:
    """The planner's spot policy (first, only, never) a launch can honour, and a line to
    say when it is not the one asked for: a cluster has no recovery, so spot-first falls
    back to on-demand and spot-only is refused."""
    if managed or spot == "never":
        return spot, None
    if spot == "only":
        raise ConfigError("--spot needs recovery, which cluster mode does not have: use "
                          "--mode jobs for spot, or --no-spot")
    return "never", ("cluster mode has no recovery from a preemption: on-demand candidates "
                     "only (--mode jobs for spot)")


def check_recovery(spec: TaskSpec) -> None:
    """Spot needs recovery: a cluster (no managed job) with a spot candidate is refused."""
    if not spec.managed and any(p.target.spot for p in spec.candidates):
        raise ConfigError("cluster mode has no recovery, so a preempted spot cluster would "
                          "simply be gone: use on-demand candidates (--no-spot) or a managed "
                          "job (--mode jobs)")


def render(spec: TaskSpec) -> RenderedTask:
    """Render the template for ``spec`` and parse it back with SkyPilot's own parser."""
    if not spec.candidates:
        raise ConfigError("nothing to launch: no candidate fits the run")
    if not spec.entry_point:
        raise ConfigError("no entry point: give the training command after --")
    check_recovery(spec)
    # several processes (nodes, or GPUs on one node) start under torchrun
    several = spec.num_nodes > 1 or any(p.target.count > 1 for p in spec.candidates)
    template = MULTI if several else SINGLE
    from burst.parallel import launching as distributed

    text = _environment().get_template(template).render(
        run_id=spec.run_id, step=spec.step, reason=spec.reason, name=spec.name,
        num_nodes=spec.num_nodes, job_recovery=job_recovery(spec),
        candidates=[resource_entry(p) for p in spec.candidates],
        envs=task_envs(spec), secrets=list(spec.secret_names),
        ca_bundle=CA_BUNDLE_ENV in spec.envs,
        bootstrap=bootstrap_source() if spec.software.python is None else None,
        setup_attempts=SETUP_ATTEMPTS, setup_backoff=SETUP_BACKOFF,
        setup_failed=int(Exit.SETUP_FAILED),
        workdir=_workdir(spec.workdir), burst=spec.software.burst, setup_args=spec.software.node_flags,
        run_args=spec.software.node_flags, entry_point=shlex.join(spec.entry_point),
        torchrun=distributed.torchrun_shell(shlex.join(_script_of(spec.entry_point))),
    )
    return parse(text)


def bootstrap_source() -> str:
    """The text of :mod:`burst.node.bootstrap`, for the setup's heredoc."""
    from burst.node import bootstrap

    text = Path(bootstrap.__file__).read_text(encoding="utf-8").rstrip("\n")
    if BOOTSTRAP_END in text.splitlines() or "\t" in text:
        raise ConfigError(f"{bootstrap.__file__} cannot go into a heredoc as it is")
    return text


def _workdir(workdir: str) -> str:
    """``code/<workdir>`` as a shell word suffix (empty for the code root)."""
    clean = os.path.normpath(workdir or ".")
    if clean.startswith(("/", "..")):
        raise ConfigError(f"the node's working directory must be inside the code: {workdir!r}")
    return "" if clean == "." else "/" + shlex.quote(clean)


def _script_of(command: Sequence[str]) -> list[str]:
    """torchrun takes the script, not ``python script``: drop a leading interpreter."""
    head = Path(command[0]).name if command else ""
    if head.startswith("python") and len(command) > 1:
        return list(command[1:])
    return list(command)


def parse(text: str) -> RenderedTask:
    """Check ``text`` with SkyPilot's own parser (``sky.Task.from_yaml_str``, offline,
    wherever SkyPilot is installed: :mod:`burst.launch.skyenv`) and keep its config.
    Without SkyPilot the task is kept unchecked (``checked_by`` None): the local stub and
    the ``ssh`` launcher run it as it is; the ``skypilot`` launcher needs SkyPilot anyway."""
    import yaml

    sky = skyenv.find()
    if sky is not None:
        skyenv.validate(text, sky)
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the rendered task is not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise ConfigError("the rendered task is not a YAML mapping")
    secrets = tuple((config.get("secrets") or {}).keys())
    return RenderedTask(text, config, secrets, None if sky is None else sky.where)

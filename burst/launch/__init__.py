"""Launchers: where a resumed run goes. One protocol, three ways to run the same task.

- ``skypilot``: the real SDK, a managed job (spot with recovery) or a cluster;
- ``ssh``: an existing GPU box over SSH (paramiko), detached so a dropped link costs nothing;
- ``local``: the SkyPilot stub, a fresh node directory on this machine that behaves like a
  managed job (ordered fallback, capacity errors, preemption and recovery).

Each takes the rendered task (:mod:`burst.launch.task`) and the secret values, and says
what it does through a :class:`Reporter`; none reaches into training state.
:func:`open_launcher` names one, as :func:`burst.store.open_store` names a store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from burst.errors import ConfigError
from burst.launch.task import RenderedTask

STUB_ROOT_ENV = "BURST_STUB_ROOT"  # the local stub's node directories


@dataclass
class Reporter:
    """Progress lines for a person, events for the run's history."""

    say: Callable[[str], None] = print
    event: Callable[..., None] = lambda _name, **_fields: None
    output: Callable[[str], object] = lambda text: print(text, end="", flush=True)


@dataclass
class LaunchResult:
    """How a launch ended: the job's exit code, and where it ran."""

    returncode: int
    where: str
    details: dict[str, Any] = field(default_factory=dict)


class Launcher(Protocol):
    """Runs a rendered task somewhere and streams its output until it ends."""

    kind: str

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        """The exact commands a launch would run (for ``--dry-run``); no side effects."""

    def launch(self, task: RenderedTask, secrets: Mapping[str, str],
               report: Reporter) -> LaunchResult:
        """Launch, stream progress, return when the job has ended (or been handed off)."""


def open_launcher(to: str, options: Mapping[str, Any]) -> Launcher:
    """The launcher ``to`` names: ``skypilot``, ``local`` or ``ssh://user@host[:port]``,
    set up from ``options`` (the ``burst resume`` options by name; absent ones take their
    defaults). Nothing here starts anything: a bad host or credential shows on launch.

    Each launcher module is imported here, when named, so that naming one never loads
    the others' SDKs (SkyPilot's import alone takes seconds)."""
    if to == "skypilot":
        from burst.launch.skypilot import SkyPilotLauncher

        return SkyPilotLauncher(options.get("mode") or "jobs", options.get("cluster"),
                                options.get("idle_minutes") or 10, bool(options.get("keep")))
    if to == "local":
        from burst.launch.local import Faults, LocalLauncher

        root = options.get("stub_root") or os.environ.get(STUB_ROOT_ENV) or ".burst-nodes"
        faults = Faults(options.get("stub_fail_first") or 0, options.get("stub_preempt_at"),
                        options.get("stub_preempt") or "term",
                        tuple(options.get("stub_faults") or ()))
        return LocalLauncher(root, faults, node_python=options.get("node_python"),
                             mode=options.get("mode") or "jobs", keep=bool(options.get("keep")),
                             system=options.get("stub_system"))
    if to.startswith("ssh://"):
        from burst.launch.ssh import SSHLauncher, Target

        target = Target.parse(to, options.get("ssh_config"), options.get("identity"),
                              options.get("known_hosts"))
        return SSHLauncher(target, options.get("remote_dir") or "~/burst-node",
                           bool(options.get("accept_new_host")),
                           options.get("node_python") or "python3")
    raise ConfigError(f"--to {to!r}: use skypilot, local or ssh://[user@]host[:port]")

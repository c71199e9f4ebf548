"""Launchers: where a resumed run goes. One protocol, three ways to run the same task.

- ``skypilot``: the real SDK, a managed job (spot with recovery) or a cluster;
- ``ssh``: an existing GPU box over SSH (paramiko), detached so a dropped link costs nothing;
- ``local``: the SkyPilot stub, a fresh node directory on this machine that behaves like a
  managed job (ordered fallback, capacity errors, preemption and recovery).

Each takes the rendered task (:mod:`burst.launch.task`) and the secret values, and says
what it does through a :class:`Reporter`; none reaches into training state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from burst.launch.task import RenderedTask


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

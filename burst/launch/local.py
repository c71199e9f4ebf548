"""The local SkyPilot stub: run a rendered task on this machine the way a managed job runs.

Each launch or recovery gets a fresh node directory with its own ``HOME`` (nothing carries
over from the launching shell or from a previous node, as on a new cloud VM), the task's
envs and secrets in the environment, and SkyPilot's variables (``SKYPILOT_TASK_ID`` stable
across recoveries, ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS``,
``SKYPILOT_NUM_GPUS_PER_NODE``). Candidates are tried in the task's ``resources.ordered``
order. For tests and drills it can refuse the first K candidates for capacity, and preempt
the job at optimizer step N (SIGTERM, as a cloud's preemption notice, or SIGKILL), after
which it recovers like ``EAGER_NEXT_REGION``: a new node on the next candidate.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from burst.errors import BurstError, ConfigError
from burst.launch import LaunchResult, Reporter
from burst.launch.task import RenderedTask
from burst.parallel.group import PORT_ENV

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

PASS_THROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONHASHSEED",
                "BURST_NODE_GPU", "CUDA_VISIBLE_DEVICES", "BURST_TEMPLATES")
MAX_RECOVERIES = 10  # preemptions are always recovered by SkyPilot; the stub stops a loop


class CapacityError(BurstError):
    """No candidate had capacity (the stub's ``ResourcesUnavailableError``)."""


@dataclass
class Faults:
    """What the stub simulates: capacity refusals and one preemption."""

    fail_first: int = 0  # refuse the first K candidates at the first provisioning
    preempt_at: int | None = None  # preempt the first job at this optimizer step
    preempt: str = "term"  # term: SIGTERM (a preemption notice), kill: SIGKILL

    def __post_init__(self) -> None:
        if self.fail_first < 0 or (self.preempt_at is not None and self.preempt_at < 1):
            raise ConfigError("stub faults: fail-first must be >= 0 and preempt-at >= 1")
        if self.preempt not in ("term", "kill"):
            raise ConfigError(f"stub preemption must be term or kill, got {self.preempt!r}")


class LocalLauncher:
    """The stub: nodes are directories under ``root``."""

    kind = "local"

    def __init__(self, root: Path | str, faults: Faults | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.faults = faults or Faults()

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        names = ", ".join(secret_names) or "none"
        return [
            f"# local SkyPilot stub: each node is a fresh directory under {self.root}",
            f"# candidates tried in order: {len(task.candidates)}; secrets in the "
            f"environment: {names}",
            "cd NODE/home && HOME=NODE/home SKYPILOT_*=... bash -c \"$SETUP\"",
            "cd NODE/home && HOME=NODE/home SKYPILOT_*=... bash -c \"$RUN\"",
        ]

    def launch(self, task: RenderedTask, secrets: Mapping[str, str],
               report: Reporter) -> LaunchResult:
        job = _Job(self, task, dict(secrets), report)
        return job.run()


class _Job:
    """One managed job: provision, run, recover, until it ends."""

    def __init__(self, launcher: LocalLauncher, task: RenderedTask, secrets: dict[str, str],
                 report: Reporter) -> None:
        self.launcher, self.task, self.secrets, self.report = launcher, task, secrets, report
        self.stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H-%M-%S-%f")
        self.task_id = f"sky-managed-{self.stamp}_{task.name}_1-0"
        self.capacity_left = launcher.faults.fail_first
        self.master_port = _free_port()
        self.nodes = 0
        recovery = task.job_recovery or {}
        self.recover_codes = set(recovery.get("recover_on_exit_codes") or [])
        self.max_restarts = int(recovery.get("max_restarts_on_errors") or 0)

    def run(self) -> LaunchResult:
        index, restarts, recoveries = 0, 0, 0
        while True:
            index = self._provision(index)
            candidate = self.task.candidates[index]
            injected = recoveries == 0 and self.launcher.faults.preempt_at is not None
            code, node = self._run_node(candidate, injected)
            where = f"local:{node}"
            if code == 0:
                return LaunchResult(0, where, {"task_id": self.task_id, "nodes": self.nodes})
            if injected and code != 0:
                self.report.event("preempted", where=where, returncode=code,
                                  task_id=self.task_id)
                self.report.say(f"stub: node {node.name} preempted (exit {code}); recovering "
                                "on the next candidate (EAGER_NEXT_REGION)")
            elif self.task.job_recovery and code in self.recover_codes \
                    and restarts < self.max_restarts:
                restarts += 1
                self.report.say(f"stub: job exited {code}, a recoverable code; restart "
                                f"{restarts} of {self.max_restarts}")
            else:
                return LaunchResult(code, where, {"task_id": self.task_id, "nodes": self.nodes})
            recoveries += 1
            if recoveries > MAX_RECOVERIES:
                raise BurstError(f"stub: gave up after {MAX_RECOVERIES} recoveries")
            index = (index + 1) % len(self.task.candidates)

    def _provision(self, start: int) -> int:
        """The first candidate from ``start`` on (in order) that has capacity."""
        candidates = self.task.candidates
        for offset in range(len(candidates)):
            index = (start + offset) % len(candidates)
            if self.capacity_left > 0:
                self.capacity_left -= 1
                label = _label(candidates[index])
                self.report.say(f"stub: no capacity for {label}; trying the next candidate")
                self.report.event("capacity", candidate=label, index=index)
                continue
            return index
        raise CapacityError(f"stub: none of the {len(candidates)} candidates has capacity")

    def _run_node(self, candidate: dict, injected: bool) -> tuple[int, Path]:
        self.nodes += 1
        nodes = self.task.num_nodes
        base = self.launcher.root / f"{self.task.name}-{self.stamp}-{self.nodes}"
        self.report.say(f"stub: launching {_label(candidate)} on {base}")
        dirs = [base / f"node{rank}" for rank in range(nodes)]
        envs = [self._env(candidate, d, rank, injected) for rank, d in enumerate(dirs)]
        for directory, env in zip(dirs, envs, strict=True):
            (directory / "home").mkdir(parents=True)
            code = _bash(self.task.setup, env, directory, "setup", self.report)
            if code != 0:
                self.report.say(f"stub: setup failed on {directory} (exit {code})")
                return code, base
        codes = _parallel([(self.task.run, env, d) for d, env in zip(dirs, envs, strict=True)],
                          self.report)
        return next((c for c in codes if c != 0), 0), base

    def _env(self, candidate: dict, directory: Path, rank: int, injected: bool
             ) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        count = _gpu_count(candidate)
        env.update({"HOME": str(directory / "home"), **self.task.envs, **self.secrets,
                    "SKYPILOT_TASK_ID": self.task_id,
                    "SKYPILOT_NODE_RANK": str(rank),
                    "SKYPILOT_NUM_NODES": str(self.task.num_nodes),
                    "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * self.task.num_nodes),
                    "SKYPILOT_NUM_GPUS_PER_NODE": str(count),
                    "SKYPILOT_CLUSTER_INFO": _cluster_info(candidate),
                    # several stub jobs on one machine must not share a rendezvous port
                    PORT_ENV: str(self.master_port)})
        faults = self.launcher.faults
        if injected and faults.preempt_at is not None:
            env["BURST_FAULT"] = f"{faults.preempt}@{faults.preempt_at}"
        return env


def _bash(script: str, env: dict[str, str], directory: Path, what: str,
          report: Reporter) -> int:
    with open(directory / f"{what}.log", "w") as log:
        process = subprocess.Popen(["bash", "-c", script], cwd=directory / "home", env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, bufsize=1)
        _copy(process.stdout, log, report)
        return process.wait()


def _parallel(jobs: list[tuple[str, dict[str, str], Path]], report: Reporter) -> list[int]:
    """Run every node's ``run`` at once (the nodes of one job rendezvous with each other)."""
    codes = [0] * len(jobs)

    def one(i: int) -> None:
        script, env, directory = jobs[i]
        codes[i] = _bash(script, env, directory, "run", report)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


def _copy(stream: IO[str] | None, log: IO[str], report: Reporter) -> None:
    if stream is None:
        return
    for line in stream:
        log.write(line)
        log.flush()
        report.output(line)


def _gpu_count(candidate: dict) -> int:
    accelerators = candidate.get("accelerators") or ""
    if isinstance(accelerators, dict):
        return int(next(iter(accelerators.values()), 1))
    _, _, count = str(accelerators).partition(":")
    return int(count or 1)


def _label(candidate: dict) -> str:
    spot = "spot" if candidate.get("use_spot") else "on-demand"
    return f"{candidate.get('accelerators')} at {candidate.get('infra') or 'any'} ({spot})"


def _cluster_info(candidate: dict) -> str:
    import json

    return json.dumps({"cluster_name": "burst-stub", "cloud": "local",
                       "region": candidate.get("infra") or "local", "zone": None,
                       "time": int(time.time())})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

"""The local SkyPilot stub: run a rendered task on this machine the way a managed job runs.

Each launch or recovery gets a fresh node directory with its own ``HOME`` (nothing carries
over from the launching shell or from a previous node, as on a new cloud VM), the task's
envs and secrets in the environment, and SkyPilot's variables (``SKYPILOT_TASK_ID`` stable
across recoveries, ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS``,
``SKYPILOT_NUM_GPUS_PER_NODE``). Candidates are tried in the task's ``resources.ordered``
order. For tests and drills it can refuse the first K candidates for capacity, and preempt
the job at optimizer step N (SIGTERM, as a cloud's preemption notice, or SIGKILL).

Recovery follows SkyPilot 0.14.1's managed-job controller (``sky/jobs/controller.py``,
``StrategyExecutor.should_restart_on_failure`` in ``sky/jobs/recovery_strategy.py``):

- a preemption that takes the machine (``kill``) is always recovered, and counts against
  nothing; after a notice (``term``) the node stops cleanly while its machine is still up
  at the controller's 5-second recheck, so the job is judged by its exit code (88 is
  recovered only when it is in ``recover_on_exit_codes``, as burst renders it);
- a failed job (its run, or its setup) is recovered when any node's exit code is in
  ``recover_on_exit_codes``, without counting; otherwise the failure is counted, and the
  job is recovered while the count is at most ``max_restarts_on_errors``, else it ends
  with that exit code;
- ``EAGER_NEXT_REGION`` relaunches over the whole ordered list, from the top (the
  previous region is only skipped for a request that names no region).

In ``cluster`` mode (``sky.launch``) nothing is recovered: a preempted or failed node ends
the job, and the node is torn down (its directory removed) unless ``keep`` is set. In
``jobs`` mode node directories are left for inspection.

Each node is sealed (:mod:`burst.launch.sealed`) where this machine allows it: it sees the
system's ``/usr`` and ``/etc`` read-only, its own directory and the store, nothing else of
this machine (not the source tree, the user's venv, pip's configuration or wheels), runs
the system's ``python3`` with a stock PATH, and reaches no package index. Where it cannot
be sealed the stub says so in one line and runs the node as a plain directory;
``BURST_STUB_SEAL=require`` makes that an error, ``off`` skips sealing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from burst.contract import ENV_FAULT, ENV_NODE_GPU, ENV_TEMPLATES
from burst.errors import BurstError, ConfigError
from burst.launch import LaunchResult, Reporter, sealed
from burst.launch.task import RenderedTask
from burst.parallel.launching import PORT_ENV
from burst.training import faults as injected

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10
UNSEALED_EVENT = "node-unsealed"  # a stub node ran on this machine as it is

PASS_THROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONHASHSEED",
                ENV_NODE_GPU, "CUDA_VISIBLE_DEVICES", ENV_TEMPLATES)
#: What a sealed node still takes from the launching shell: how to behave, not where things
#: are (PATH, TMPDIR and BURST_TEMPLATES name this machine's files).
SEALED_PASS_THROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHASHSEED", ENV_NODE_GPU,
                       "CUDA_VISIBLE_DEVICES")
MAX_RECOVERIES = 10  # SkyPilot never stops recovering preemptions; the stub stops a loop
MODES = ("jobs", "cluster")


class CapacityError(BurstError):
    """No candidate had capacity (the stub's ``ResourcesUnavailableError``)."""


@dataclass
class Faults:
    """What the stub simulates: capacity refusals, and faults of the job's attempts.

    ``attempts``: the ``BURST_FAULT`` of each attempt in turn (the first launch, then
    each recovery), e.g. five preemptions and then a GPU failure; ``preempt_at`` is the
    short form for one preemption of the first attempt. A ``term`` fault is a preemption
    notice: the node stops cleanly (88) while its machine is still up when the managed-jobs
    controller rechecks 5 seconds later, so the controller judges the job by its exit
    code; a ``kill`` is the machine taken away (the cluster is gone: a preemption)."""

    fail_first: int = 0  # refuse the first K candidates at the first provisioning
    preempt_at: int | None = None  # preempt the first job at this optimizer step
    preempt: str = "term"  # term: SIGTERM (a preemption notice), kill: SIGKILL
    attempts: tuple[str, ...] = ()  # each attempt's BURST_FAULT (overrides preempt_at)

    def __post_init__(self) -> None:
        if self.fail_first < 0 or (self.preempt_at is not None and self.preempt_at < 1):
            raise ConfigError("stub faults: fail-first must be >= 0 and preempt-at >= 1")
        if self.preempt not in ("term", "kill"):
            raise ConfigError(f"stub preemption must be term or kill, got {self.preempt!r}")
        for spec in self.attempts:
            injected.parse(spec)  # a typo is an error now, not a fault that never fires

    def for_attempt(self, attempt: int) -> str | None:
        """The ``BURST_FAULT`` of attempt ``attempt`` (0: the first launch)."""
        if self.attempts:
            return self.attempts[attempt] if attempt < len(self.attempts) else None
        if attempt == 0 and self.preempt_at is not None:
            return f"{self.preempt}@{self.preempt_at}"
        return None

    def preemption(self, attempt: int) -> str | None:
        """``term`` (a notice) or ``kill`` (the machine taken) when that attempt is
        preempted; None when it is not."""
        kinds = [f.kind for f in injected.parse(self.for_attempt(attempt))]
        return next((k for k in ("kill", "term") if k in kinds), None)


@dataclass(frozen=True)
class Sealing:
    """How the stub seals a job's nodes: what each is given besides its own directory."""

    binds: tuple[Path, ...]  # a file:// store
    ports: tuple[int, ...] | None  # the store's loopback ports; None: this machine's network
    system: Path = Path("/")  # whose /usr, /lib, /etc the node runs (another distribution's)


class LocalLauncher:
    """The stub: nodes are directories under ``root``, sealed where the machine allows.

    ``seal``: ``auto``, ``require`` or ``off`` (default ``$BURST_STUB_SEAL``, else auto).
    ``node_python``: the task runs this machine's interpreter (``--node-python``), which a
    sealed node cannot see, so such a node is not sealed (an error under ``require``).
    ``mode``: ``jobs`` (a managed job, recovered) or ``cluster`` (``sky.launch``: no
    recovery; the node is torn down at the end unless ``keep``). ``system``: the root a
    sealed node's system directories come from (default ``$BURST_STUB_SYSTEM``, else this
    machine's): another distribution's, so the node's Python is not this machine's.
    """

    kind = "local"

    def __init__(self, root: Path | str, faults: Faults | None = None,
                 seal: str | None = None, node_python: str | None = None,
                 mode: str = "jobs", keep: bool = False,
                 system: Path | str | None = None) -> None:
        if mode not in MODES:
            raise ConfigError(f"stub mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.root = Path(root).expanduser().resolve()
        self.faults = faults or Faults()
        self.seal = sealed.mode(seal)
        self.node_python = node_python
        self.mode, self.keep = mode, keep
        self.system = system

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        names = ", ".join(secret_names) or "none"
        why = self.unsealed_because()  # what the launch would find: said now, not after
        how = (f"a plain directory, NOT sealed ({why})" if why else
               "a sealed node (own mount, pid and network namespaces; system /usr and /etc "
               "read-only; no package index)")
        return [
            f"# local SkyPilot stub: each node is a fresh directory under {self.root}, "
            f"run as {how}",
            f"# candidates tried in order: {len(task.candidates)}; secrets in the "
            f"environment: {names}",
            "cd NODE/home && HOME=NODE/home SKYPILOT_*=... bash -c \"$SETUP\"",
            "cd NODE/home && HOME=NODE/home SKYPILOT_*=... bash -c \"$RUN\"",
        ] + ([] if self.mode == "jobs" or self.keep else
             ["rm -rf NODE  # cluster mode: torn down when the run ends (--keep keeps it)"])

    def unsealed_because(self) -> str | None:
        """Why this launcher's nodes would run unsealed (None: they are sealed); raises
        ``SealError`` where sealing is required and impossible."""
        if self.seal == "off":
            return f"${sealed.SEAL_ENV}=off"
        why = (f"--node-python {self.node_python} is this machine's interpreter"
               if self.node_python else sealed.problem())
        if why and self.seal == "require":
            raise sealed.SealError(f"stub: cannot seal the node ({why}) and "
                                   f"${sealed.SEAL_ENV}=require")
        return why

    def sealing(self, task: RenderedTask, report: Reporter) -> Sealing | None:
        """How this task's nodes are sealed; None where they cannot be, said as a warning
        and recorded in the run's history (``node-unsealed``): whatever is missing (not
        root, no ``unshare``, no ``pivot_root``), a node that shares this machine's files
        proves nothing about a cloud node, and nobody should read its success as that."""
        why = self.unsealed_because()
        if why:
            report.say(f"WARNING: stub: node NOT sealed ({why}): it runs on this machine as "
                       "it is, with its files, venv, pip configuration and network; "
                       f"${sealed.SEAL_ENV}=require refuses to")
            report.event(UNSEALED_EVENT, reason=why)
            return None
        ports = sealed.store_ports(task.envs)
        if ports is None:
            report.say("stub: node sealed, but on this machine's network: its store is not "
                       "on this machine (package indexes are only pointed at a dead port)")
        system = sealed.system_root(self.system)
        if system != Path("/"):
            report.say(f"stub: the node's system is {system} (not this machine's)")
        return Sealing(tuple(sealed.store_dirs(task.envs)),
                       None if ports is None else tuple(ports), system)

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
        self.managed = launcher.mode == "jobs"
        recovery = task.job_recovery or {}
        codes = recovery.get("recover_on_exit_codes") or []
        self.recover_codes = {int(c) for c in ([codes] if isinstance(codes, int) else codes)}
        self.max_restarts = int(recovery.get("max_restarts_on_errors") or 0)
        self.restart_count = 0  # SkyPilot's restart_cnt_on_failure
        self.sealing: Sealing | None = None

    def run(self) -> LaunchResult:
        self.sealing = self.launcher.sealing(self.task, self.report)
        recoveries = 0
        while True:
            # EAGER_NEXT_REGION: every launch, and every recovery, walks the list from the top
            candidate = self.task.candidates[self._provision()]
            codes, node = self._run_node(candidate, recoveries)
            code = next((c for c in codes if c != 0), 0)
            preemption = self.launcher.faults.preemption(recoveries)
            if code == 0 or not self._recovers(codes, preemption, node):
                return self._end(code, node)
            recoveries += 1
            if recoveries > MAX_RECOVERIES:
                raise BurstError(f"stub: gave up after {MAX_RECOVERIES} recoveries")

    def _recovers(self, codes: list[int], preemption: str | None, node: Path) -> bool:
        """Whether SkyPilot brings the job up again after ``codes`` (one per node), its
        attempt preempted by ``preemption`` (``kill``, ``term`` or None)."""
        code = next((c for c in codes if c != 0), 0)
        if not self.managed:
            self.report.say(f"stub: cluster node {node.name} ended (exit {code}); a cluster "
                            "has no recovery")
            return False
        if preemption is not None:
            self.report.event("preempted", where=f"local:{node}", returncode=code,
                              task_id=self.task_id, cluster="up" if preemption == "term"
                              else "gone")
        if preemption == "kill":
            self.report.say(f"stub: node {node.name} preempted (exit {code}); recovering "
                            "from the top of the ordered list (EAGER_NEXT_REGION)")
            return True
        if preemption == "term":
            self.report.say(f"stub: node {node.name} stopped after a preemption notice (exit "
                            f"{code}) and its machine is still up at the controller's "
                            "5-second recheck: the job is judged by its exit code")
        matched = [c for c in codes if c in self.recover_codes]
        if matched:
            self.report.say(f"stub: job exited {matched[0]}, in recover_on_exit_codes "
                            f"{sorted(self.recover_codes)}: recovering (not counted)")
            return True
        self.restart_count += 1
        if self.restart_count > self.max_restarts:
            self.report.say(f"stub: job failed (exit {code}) and will not be retried "
                            f"(max_restarts_on_errors {self.max_restarts})")
            return False
        self.report.say(f"stub: job failed (exit {code}); restart {self.restart_count} of "
                        f"{self.max_restarts} on errors")
        return True

    def _end(self, code: int, node: Path) -> LaunchResult:
        """The job is over: a cluster is torn down unless kept."""
        details = {"task_id": self.task_id, "nodes": self.nodes}
        if not self.managed:
            if self.launcher.keep:
                self.report.say(f"stub: cluster node kept at {node} (--keep)")
            else:
                self.report.say(f"stub: tearing down cluster node {node}")
                shutil.rmtree(node, ignore_errors=True)
            details["kept"] = self.launcher.keep
        return LaunchResult(code, f"local:{node}", details)

    def _provision(self) -> int:
        """The first candidate, in the task's order, that has capacity."""
        candidates = self.task.candidates
        for index in range(len(candidates)):
            if self.capacity_left > 0:
                self.capacity_left -= 1
                label = _label(candidates[index])
                self.report.say(f"stub: no capacity for {label}; trying the next candidate")
                self.report.event("capacity", candidate=label, index=index)
                continue
            return index
        raise CapacityError(f"stub: none of the {len(candidates)} candidates has capacity")

    def _run_node(self, candidate: dict, attempt: int) -> tuple[list[int], Path]:
        """Set up and run the job on fresh node(s): each node's exit code (a failed setup:
        that one code, as SkyPilot's FAILED_SETUP)."""
        self.nodes += 1
        nodes = self.task.num_nodes
        base = self.launcher.root / f"{self.task.name}-{self.stamp}-{self.nodes}"
        self.report.say(f"stub: launching {_label(candidate)} on {base}")
        dirs = [base / f"node{rank}" for rank in range(nodes)]
        envs = [self._env(candidate, d, rank, attempt) for rank, d in enumerate(dirs)]
        with self._network() as network:
            shells = [self._shell(d, network) for d in dirs]
            for directory, env, shell in zip(dirs, envs, shells, strict=True):
                (directory / "home").mkdir(parents=True)
                started = time.monotonic()
                code = _bash(self.task.setup, env, directory, "setup", self.report, shell)
                self.report.say(f"stub: setup on {directory.name} took "
                                f"{time.monotonic() - started:.1f}s (exit {code})")
                if code != 0:
                    self.report.say(f"stub: setup failed on {directory} (exit {code})")
                    return [code], base
            codes = _parallel([(self.task.run, env, d, shell) for d, env, shell
                               in zip(dirs, envs, shells, strict=True)], self.report)
        return codes, base

    def _network(self):
        """One sealed network per job attempt (its nodes rendezvous on its loopback)."""
        if self.sealing is None or self.sealing.ports is None:
            return nullcontext(None)
        return sealed.Loopback(self.sealing.ports)

    def _shell(self, directory: Path, network: sealed.Loopback | None) -> _Shell:
        if self.sealing is None:
            return _Shell()
        node = sealed.Node(directory / "sealed-root", directory / "home", self.sealing.binds,
                           self.sealing.system)
        return _Shell(node, network)

    def _env(self, candidate: dict, directory: Path, rank: int, attempt: int
             ) -> dict[str, str]:
        names = PASS_THROUGH if self.sealing is None else SEALED_PASS_THROUGH
        env = {k: os.environ[k] for k in names if k in os.environ}
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
        fault = self.launcher.faults.for_attempt(attempt)
        if fault:
            env[ENV_FAULT] = fault
        if self.sealing is not None:
            env = sealed.environment(env, directory / "home")
        return env


@dataclass(frozen=True)
class _Shell:
    """Where a node's scripts run: this machine (``node`` None) or a sealed node."""

    node: sealed.Node | None = None
    network: sealed.Loopback | None = None

    def argv(self, script: str) -> list[str]:
        if self.node is None:
            return ["bash", "-c", script]
        return sealed.command(self.node, script, self.network)


def _bash(script: str, env: dict[str, str], directory: Path, what: str,
          report: Reporter, shell: _Shell | None = None) -> int:
    shell = shell or _Shell()
    if shell.node is not None:
        shell.node.prepare()
    with open(directory / f"{what}.log", "w") as log:
        process = subprocess.Popen(shell.argv(script), cwd=directory / "home", env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, bufsize=1)
        _copy(process.stdout, log, report)
        return process.wait()


def _parallel(jobs: Sequence[tuple[str, dict[str, str], Path, _Shell]], report: Reporter
              ) -> list[int]:
    """Run every node's ``run`` at once (the nodes of one job rendezvous with each other)."""
    codes = [0] * len(jobs)

    def one(i: int) -> None:
        script, env, directory, shell = jobs[i]
        codes[i] = _bash(script, env, directory, "run", report, shell)

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

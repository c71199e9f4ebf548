"""The contract between burst's processes: snapshot reasons, exit codes, environment names.

A training child, the agent supervising it, a resumed node and the laptop that launched
it are different processes, often on different machines and Python versions; what they
tell each other travels as strings in manifests and events, as exit statuses and as
environment variables. Each of those values is defined here once, so a reader and a
writer can never disagree on a spelling. This module is a leaf: the standard library
only (no torch, no other burst module), so any process, the CLI's listing commands
included, can import it for nothing.

The node bootstrap (:mod:`burst.node.bootstrap`) runs before burst is installed and
cannot import this module: it spells the names it reads itself, and a test holds them
equal to the ones here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum, IntEnum
from typing import TypeGuard


class Reason(str, Enum):
    """Why a snapshot was taken (the manifest's ``reason``), and how a rank failed (a
    failure record's ``kind``): a str, so manifests and events hold the same strings as
    ever and a string read back from one compares equal to its member."""

    PERIODIC = "periodic"  # the persist interval came due
    MANUAL = "manual"  # the script called Run.snapshot()
    FINAL = "final"  # the run closed after its last step
    SIGNAL = "signal"  # SIGTERM/SIGINT: a snapshot at the boundary, then stop
    OOM = "oom"  # CUDA ran out of memory
    GPU_FAILURE = "gpu-failure"  # a sticky CUDA error: only the RAM shadow is trusted
    PREEMPTION = "preemption"  # the cloud announced this machine's reclaim
    FENCED = "fenced"  # a newer launch of the run took over: stop, no snapshot

    def __str__(self) -> str:  # the value, on every Python (3.12 formats members by name)
        return str(self.value)


class Exit(IntEnum):
    """burst's exit codes: what a training process, a node or a listing tells its parent.

    SkyPilot recovers a managed job only on the codes a new machine can fix
    (:data:`burst.launch.task.RECOVER_ON`), never on :attr:`OOM`."""

    OOM = 86
    GPU_FAILURE = 87
    STOPPED = 88  # stopped on SIGTERM/SIGINT after a snapshot at a step boundary
    # a node started more often than the run's restart bound allows (burst.node.restarts):
    # not in recover_on_exit_codes, so SkyPilot ends the job
    RESTART_LIMIT = 89
    # stopped because a newer launch of the run took over (burst.snapshot.lineage): its
    # snapshots are refused, so it must not train on; nothing to retry or resume from here
    FENCED = 90
    # the node's setup failed after its retries (burst/templates/task.yaml.j2): the store or
    # the network kept failing; a deterministic problem exits 2 at once instead
    SETUP_FAILED = 91
    # the run's store could not be reached (or refused) as the run started: nothing was
    # trained, nothing is lost; start it again once the store answers (burst.training.outage)
    STORE_UNREACHABLE = 92
    # training finished and its final snapshot is in the local tier, but uploading it to the
    # store failed: `burst push` uploads it later; rerunning the training is not needed
    UPLOAD_FAILED = 93
    # a listing of a store's runs (burst ls, burst status) listed every run it could read,
    # but one or more runs could not be read (a corrupt or unreadable manifest): each is one
    # row with its reason (burst.snapshot.catalog), and the exit status says the list is short
    RUNS_UNREADABLE = 94

    def __str__(self) -> str:  # "86" on every Python (3.10 would say "Exit.OOM")
        return str(self.value)


# -- environment variables that cross a process boundary --------------------------------------

# the run: set by the user, the agent or the task; read by Run, the CLI and the node
ENV_RUN_ID = "BURST_RUN_ID"
ENV_STORE = "BURST_STORE"  # the run's store URL (the node's and the child's)
ENV_LOCAL = "BURST_LOCAL"  # the local tier in front of it

# the plan (PlanEnv): written by the planner, the node and the agent, read by Run
ENV_MICRO_BATCH = "BURST_MICRO_BATCH"
ENV_ACCUMULATION = "BURST_ACCUMULATION"  # checked by Run, not trusted blindly
ENV_WORLD_SIZE = "BURST_WORLD_SIZE"  # checked by Run, not trusted blindly
ENV_AMP = "BURST_AMP"
ENV_GRAD_SCALER = "BURST_GRAD_SCALER"
ENV_TF32 = "BURST_TF32"
ENV_PROBE = "BURST_PROBE"
ENV_PROBE_MICRO_BATCHES = "BURST_PROBE_MICRO_BATCHES"

# what `burst resume` asks of the node's own re-plan (burst.resume.node)
ENV_PLAN_AMP = "BURST_PLAN_AMP"
ENV_PLAN_MARGIN = "BURST_PLAN_MARGIN"
ENV_PLAN_MICRO_BATCH = "BURST_PLAN_MICRO_BATCH"  # a micro-batch the user forced at resume

# the node: set by the task (or a test), read by the bootstrap and burst's node side
ENV_NODE_DIR = "BURST_NODE_DIR"
ENV_NODE_GPU = "BURST_NODE_GPU"  # "cpu" or a card name: what NVML would say
ENV_LOCKFILE_DIGEST = "BURST_LOCKFILE_DIGEST"
ENV_PYTHON = "BURST_PYTHON"  # the interpreter the lockfile names, e.g. 3.11
ENV_SPEC = "BURST_SPEC"  # the pip requirement that installs burst on the node
ENV_PYTHON_MIRROR = "BURST_PYTHON_MIRROR"  # what the node's uv downloads Python from
ENV_INDEX_URL = "BURST_INDEX_URL"  # package mirrors the task forwards
ENV_EXTRA_INDEX_URL = "BURST_EXTRA_INDEX_URL"
ENV_TORCH_INDEX = "BURST_TORCH_INDEX"
ENV_TEMPLATES = "BURST_TEMPLATES"  # the task templates (tests, a packaged checkout)

# the store's settings that a task forwards to the node
ENV_ENDPOINT_URL = "BURST_ENDPOINT_URL"
ENV_METADATA_URL = "BURST_METADATA_URL"  # the cloud metadata server (roles, preemption)

# the CLI: plan from the embedded card table only (also set on nodes, which reach no catalog)
ENV_OFFLINE = "BURST_OFFLINE"

# the agent and its child
ENV_FAILURE_DIR = "BURST_FAILURE_DIR"  # a fresh directory per attempt for failure records
ENV_FAULT = "BURST_FAULT"  # a drill's injected fault (burst.training.faults)
ENV_GPU_MEMORY_QUOTA = "BURST_GPU_MEMORY_QUOTA"  # bytes the child may allocate


# -- the plan's record ----------------------------------------------------------------------


@dataclass(frozen=True)
class PlanEnv:
    """The part of a plan that travels to the training process in its environment.

    A field left None is not in the environment (a node keeping the snapshot's layout
    says no precision flags; the agent retrying smaller says only the batch split);
    ``from_env(plan.to_env()) == plan``. ``amp`` is the raw name ("bf16", "none"...),
    parsed by the training side."""

    micro_batch: int | None = None
    accumulation: int | None = None
    world_size: int | None = None
    amp: str | None = None
    grad_scaler: bool | None = None
    tf32: bool | None = None
    probe: bool | None = None
    probe_micro_batches: tuple[int, ...] | None = None

    def to_env(self) -> dict[str, str]:
        """The variables this plan sets, in field order; fields left None are absent."""
        out = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is not None:
                out[_NAMES[spec.name]] = _encode(value)
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PlanEnv:
        """The plan ``environ`` carries; a variable unset or empty is None. A number that
        is not one raises ValueError with a one-line message naming the variable; a flag
        other than "1" or "0" is None (the training side has always ignored those)."""
        return cls(
            micro_batch=env_int(environ, ENV_MICRO_BATCH),
            accumulation=env_int(environ, ENV_ACCUMULATION),
            world_size=env_int(environ, ENV_WORLD_SIZE),
            amp=environ.get(ENV_AMP),
            grad_scaler=_flag(environ.get(ENV_GRAD_SCALER)),
            tf32=_flag(environ.get(ENV_TF32)),
            probe=_flag(environ.get(ENV_PROBE)),
            probe_micro_batches=_sizes(environ),
        )


_NAMES = {"micro_batch": ENV_MICRO_BATCH, "accumulation": ENV_ACCUMULATION,
          "world_size": ENV_WORLD_SIZE, "amp": ENV_AMP, "grad_scaler": ENV_GRAD_SCALER,
          "tf32": ENV_TF32, "probe": ENV_PROBE, "probe_micro_batches": ENV_PROBE_MICRO_BATCHES}


def _encode(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def env_int(environ: Mapping[str, str], name: str) -> int | None:
    """``$name`` as an integer (None when unset or empty); a one-line ValueError else."""
    raw = environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {raw!r}") from None


def _flag(raw: str | None) -> bool | None:
    return {"1": True, "0": False}.get(raw or "")


def parse_sizes(raw: str) -> tuple[int, ...]:
    """``BURST_PROBE_MICRO_BATCHES``'s comma-separated sizes (none for ""); ValueError with
    a one-line message for anything else or a size below 1."""
    try:
        sizes = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"${ENV_PROBE_MICRO_BATCHES} must be comma-separated integers, "
                         f"got {raw!r}") from None
    if any(size < 1 for size in sizes):
        raise ValueError(f"${ENV_PROBE_MICRO_BATCHES} holds a size below 1: {raw!r}")
    return sizes


def _sizes(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    raw = environ.get(ENV_PROBE_MICRO_BATCHES)
    return None if raw is None else parse_sizes(raw)


# -- goodput: what a change of a run's membership cost ----------------------------------------

MEMBERSHIP_EVENT = "membership-change"


class StateSource(str, Enum):
    """Where the ranks after a membership change got the training state from."""

    RAM = "ram"  # the surviving ranks' own host-RAM shadows
    PEER = "peer"  # copies of a lost node's shards held in its neighbours' RAM
    STORE = "store"  # a persisted snapshot (the local tier or the object store)

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class MembershipChange:
    """One change of the set of processes training a run (a restart from a snapshot after
    a failure today; an elastic shrink or grow later), as the ``membership-change`` event
    records it for ``burst report`` and the metrics exporter.

    ``steps_lost``: optimizer steps completed after the restored state that the run's
    history knows of (a SIGKILL takes its unsaved records with it: a lower bound), None
    when nothing says. ``seconds_to_step``: from the loss (the failure's or the exit's
    event) to the first optimizer step after the change, None when the loss left no
    trace. The world sizes count ranks; ``world_before`` is None when unknown."""

    step: int  # the step the state was restored at
    state_from: StateSource
    world_after: int
    world_before: int | None = None
    steps_lost: int | None = None
    seconds_to_step: float | None = None
    cause: str | None = None  # the failure's kind, e.g. "oom", "killed"

    def to_event(self) -> dict[str, object]:
        """The event's fields (the enum as its string)."""
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Enum) else v)
                for f in fields(self)}

    @classmethod
    def from_event(cls, event: Mapping[str, object]) -> MembershipChange | None:
        """The record an event holds, or None when a field is missing or mistyped (a
        history is anyone's to damage; a reader skips such a line)."""
        step, world_after = event.get("step"), event.get("world_after")
        world_before, steps_lost = event.get("world_before"), event.get("steps_lost")
        seconds, cause = event.get("seconds_to_step"), event.get("cause")
        if not (_whole(step) and _whole(world_after) and _whole_or_none(world_before)
                and _whole_or_none(steps_lost) and _seconds_or_none(seconds)):
            return None
        try:
            state_from = StateSource(event.get("state_from"))
        except ValueError:
            return None
        return cls(step=step, state_from=state_from, world_after=world_after,
                   world_before=world_before, steps_lost=steps_lost,
                   seconds_to_step=None if seconds is None else float(seconds),
                   cause=cause if isinstance(cause, str) else None)


def _whole(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _whole_or_none(value: object) -> TypeGuard[int | None]:
    return value is None or _whole(value)


def _seconds_or_none(value: object) -> TypeGuard[float | None]:
    if value is None:
        return True
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and 0 <= value < float("inf")

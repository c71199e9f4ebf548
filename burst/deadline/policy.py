"""The deadline policy: stay local, burst on spot, or burst on on-demand, and why.

Pure: the run's recorded progress, the deadline and the cost of moving in; a
:class:`Decision` with every number out. Nothing here reads a store or the clock, so a
simulated trace tests every branch.

The rule (after SkyPilot's "Can't Be Late" uniform-progress policy, NSDI '24):

* Predict the local finish from the recent pace (steps per second over the newest
  snapshots of the current session). A run whose snapshots stopped coming, or that
  recorded a failure, will not finish locally at all.
* While the local finish leaves at least the *margin* before the deadline (provisioning a
  node, installing the frozen environment, uploading and restoring the snapshot), stay:
  the local card is already paid for.
* Once it does not, burst now, since waiting only shrinks the slack. Use spot while the
  cloud finish still leaves slack for ``spot_recoveries`` preemptions (each costs another
  margin); when it does not, on-demand, which cannot be taken away.
* Never burst to a cloud that would finish later than the local run.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from burst.deadline.timespec import human, iso
from burst.errors import ConfigError

STAY, WAIT, BLIND, DONE = "stay", "wait", "blind", "done"
BURST_SPOT, BURST_ON_DEMAND = "burst-spot", "burst-on-demand"
ACTIONS = (STAY, WAIT, BLIND, DONE, BURST_SPOT, BURST_ON_DEMAND)

# What becomes of the local training once a burst's node took the run over. Either way the
# local run is fenced (burst.snapshot.lineage): its snapshots are refused from then on.
# stop: SIGTERM it, so it stops at a step boundary now instead of training for nothing
# until its next snapshot is refused; detach: leave it running (a person decides).
LOCAL_STOP, LOCAL_DETACH = "stop", "detach"
LOCAL_RUN_MODES = (LOCAL_STOP, LOCAL_DETACH)


def local_run_mode(text: str) -> str:
    """``stop`` or ``detach`` (what ``--local-run`` accepts); anything else is a usage error."""
    if text not in LOCAL_RUN_MODES:
        raise ConfigError(f"the local run's fate after a burst is one of "
                          f"{', '.join(LOCAL_RUN_MODES)}, not {text!r}")
    return text


DEFAULT_WINDOW = timedelta(hours=1)
STALL_FACTOR = 4.0  # silent for this many typical snapshot gaps: the run has stopped
MIN_STALL = timedelta(minutes=20)


# -- progress --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """What the run's history says about its pace at one moment."""

    step: int
    total_steps: int | None
    steps_per_second: float | None
    last_snapshot: datetime | None
    finished: bool = False
    stalled: bool = False  # no snapshot for too long, or a failure after the last one
    why_stalled: str = ""

    @property
    def remaining(self) -> int | None:
        return None if self.total_steps is None else max(self.total_steps - self.step, 0)


def measure(history: Sequence[Mapping[str, Any]], now: datetime, *,
            total_steps: int | None = None, manifest: Mapping[str, Any] | None = None,
            window: timedelta = DEFAULT_WINDOW) -> Progress:
    """Progress from the run's events (oldest first) and its newest manifest, as of ``now``.

    Events later than ``now`` are ignored, so a whole synthetic trace can be replayed
    against a simulated clock. The pace is taken over ``window`` of the newest session
    (start or resume to now), so a run that slows down is noticed within the window
    rather than averaged away over days.
    """
    session, finished, failed_at = _session(history, now)
    counters = (manifest or {}).get("counters") or {}
    step = max([int(counters.get("step", 0) or 0)] + [s for _, s in session])
    total = total_steps if total_steps is not None else _int(counters.get("total_steps"))
    last = session[-1][0] if session else None
    stalled, why = _stall(session, now, failed_at)
    return Progress(step, total, _pace(session, window), last, finished or _reached(step, total),
                    stalled, why)


def _session(history: Sequence[Mapping[str, Any]], now: datetime
             ) -> tuple[list[tuple[datetime, int]], bool, datetime | None]:
    """Snapshot points of the newest session, whether it finished, and when it failed."""
    points: list[tuple[datetime, int]] = []
    finished, failed_at = False, None
    for event in history:
        moment = _time(event)
        if moment is None or moment > now:
            continue
        kind = event.get("event")
        if kind in ("start", "resume"):
            points, finished, failed_at = [], False, None
        elif kind == "snapshot" and isinstance(event.get("step"), int):
            points.append((moment, int(event["step"])))
        elif kind == "finish":
            finished = True
        elif kind == "failure":
            failed_at = moment
    return points, finished, failed_at


def _pace(points: Sequence[tuple[datetime, int]], window: timedelta) -> float | None:
    if len(points) < 2:
        return None
    recent = [p for p in points if p[0] >= points[-1][0] - window]
    (t0, s0), (t1, s1) = recent[0] if len(recent) >= 2 else points[-2], points[-1]
    seconds = (t1 - t0).total_seconds()
    return (s1 - s0) / seconds if seconds > 0 and s1 > s0 else None


def _stall(points: Sequence[tuple[datetime, int]], now: datetime,
           failed_at: datetime | None) -> tuple[bool, str]:
    if failed_at is not None and (not points or failed_at >= points[-1][0]):
        return True, f"the run recorded a failure at {iso(failed_at)}"
    if len(points) < 2:
        return False, ""
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(points)]
    allowed = max(STALL_FACTOR * statistics.median(gaps), MIN_STALL.total_seconds())
    silent = (now - points[-1][0]).total_seconds()
    if silent > allowed:
        return True, f"no snapshot for {human(silent)} (usually every {human(statistics.median(gaps))})"
    return False, ""


def _reached(step: int, total: int | None) -> bool:
    return total is not None and step >= total


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(event: Mapping[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(event.get("time")))
    except ValueError:
        return None


# -- what moving costs, and how fast the cloud goes ------------------------------------------


@dataclass(frozen=True)
class Margin:
    """Seconds between deciding to burst and the cloud node taking its first step."""

    provision_s: float = 600.0  # a node, spot or on-demand, from request to SSH
    install_s: float = 600.0  # the frozen environment: wheels, CUDA libraries
    upload_s: float = 0.0  # the newest snapshot to the store (the scheduled backup)
    restore_s: float = 120.0  # pull, verify, load, warm up
    override_s: float | None = None  # the user's own figure (--margin) replaces the sum

    @property
    def total_s(self) -> float:
        if self.override_s is not None:
            return self.override_s
        return self.provision_s + self.install_s + self.upload_s + self.restore_s

    def fields(self) -> dict[str, Any]:
        parts = {"provision_s": self.provision_s, "install_s": self.install_s,
                 "upload_s": self.upload_s, "restore_s": self.restore_s}
        return {"margin_s": round(self.total_s, 1),
                **({"margin_parts": {k: round(v, 1) for k, v in parts.items()}}
                   if self.override_s is None else {"margin_source": "--margin"})}


def estimate_margin(snapshot_bytes: int, *, upload_bytes_per_s: float = 20e6,
                    download_bytes_per_s: float = 50e6, **fixed: float) -> Margin:
    """The margin for a snapshot of ``snapshot_bytes``: fixed parts plus transfer times."""
    base = Margin(**fixed)
    restore = base.restore_s + snapshot_bytes / download_bytes_per_s
    return Margin(base.provision_s, base.install_s, snapshot_bytes / upload_bytes_per_s,
                  restore, base.override_s)


@dataclass(frozen=True)
class CloudPace:
    """Predicted steps per second in the cloud, per tier, and where the figure came from."""

    spot: float | None
    on_demand: float | None
    source: str = ""
    speedup: float = 1.0  # without a planner figure: this many times the local pace

    def rates(self, local: float | None) -> tuple[float | None, float | None]:
        """(spot, on-demand) steps per second, falling back to ``speedup`` x the local pace."""
        fallback = local * self.speedup if local else None
        return self.spot or fallback, self.on_demand or fallback


@dataclass(frozen=True)
class Policy:
    """The deadline and what the decision weighs against it."""

    deadline: datetime
    margin: Margin = field(default_factory=Margin)
    cloud: CloudPace = field(default_factory=lambda: CloudPace(None, None))
    spot_recoveries: int = 1  # preemptions the slack must absorb before spot is worth it
    local_run: str = LOCAL_STOP  # after a burst: stop the local training, or detach it

    def __post_init__(self) -> None:
        local_run_mode(self.local_run)

    @property
    def spot_reserve_s(self) -> float:
        return self.spot_recoveries * self.margin.total_s


# -- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One decision and the numbers behind it (all of them go to the events log)."""

    action: str
    reason: str
    numbers: dict[str, Any]

    @property
    def bursts(self) -> bool:
        return self.action in (BURST_SPOT, BURST_ON_DEMAND)

    @property
    def spot(self) -> bool:
        return self.action == BURST_SPOT

    def fields(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, **self.numbers}


def decide(progress: Progress, policy: Policy, now: datetime) -> Decision:
    """Stay, wait, or burst (spot or on-demand), with the reason and the numbers."""
    numbers = _base_numbers(progress, policy, now)
    if progress.finished:
        return Decision(DONE, f"the run has reached step {progress.step}: nothing to do",
                        numbers)
    remaining = progress.remaining
    if remaining is None:
        return Decision(BLIND, "the run's total step count is unknown (record total_epochs in "
                        "the run or pass --total-steps): backups only", numbers)
    rate = progress.steps_per_second
    if rate is None and not progress.stalled:
        return Decision(WAIT, "fewer than two snapshots in this session: no pace yet", numbers)
    local_finish = None if progress.stalled else _local_finish(progress, rate)
    numbers.update(_local_numbers(progress, policy, local_finish))
    margin = policy.margin.total_s
    if local_finish is not None and (policy.deadline - local_finish).total_seconds() >= margin:
        return Decision(STAY, f"on track: local finish {_at(local_finish, policy)}, "
                        f"{human(policy.deadline - local_finish)} before the deadline "
                        f"(margin {human(margin)})", numbers)
    return _burst(progress, policy, now, local_finish, numbers)


def _burst(progress: Progress, policy: Policy, now: datetime, local_finish: datetime | None,
           numbers: dict[str, Any]) -> Decision:
    remaining = progress.remaining or 0
    spot_rate, demand_rate = policy.cloud.rates(progress.steps_per_second)
    spot = _cloud_finish(now, remaining, spot_rate, policy)
    demand = _cloud_finish(now, remaining, demand_rate, policy)
    numbers.update(_cloud_numbers("spot", spot, spot_rate, policy))
    numbers.update(_cloud_numbers("on_demand", demand, demand_rate, policy))
    behind = _why_behind(progress, policy, local_finish)
    if demand is None:
        return Decision(WAIT, f"{behind}, but no cloud pace is known", numbers)
    if local_finish is not None and demand >= local_finish:
        return Decision(STAY, f"{behind}, but the cloud would finish later "
                        f"({_at(demand, policy)}): staying local", numbers)
    slack = (policy.deadline - spot).total_seconds() if spot is not None else -math.inf
    if spot is not None and slack >= policy.spot_reserve_s:
        return Decision(BURST_SPOT, f"{behind}; spot finishes {_at(spot, policy)} "
                        f"with {human(slack)} slack (reserve {human(policy.spot_reserve_s)})",
                        numbers)
    late = (demand - policy.deadline).total_seconds()
    tail = (f"on-demand misses the deadline by {human(late)} but finishes soonest" if late > 0
            else f"on-demand finishes {_at(demand, policy)}")
    why_not_spot = ("no spot pace is known" if spot is None else
                    f"spot slack {human(slack)} is under the {human(policy.spot_reserve_s)} "
                    "reserve")
    return Decision(BURST_ON_DEMAND, f"{behind}; {why_not_spot}; {tail}", numbers)


def _why_behind(progress: Progress, policy: Policy, local_finish: datetime | None) -> str:
    if local_finish is None:
        return progress.why_stalled or "the local run is not progressing"
    slack = policy.deadline - local_finish
    if slack.total_seconds() < 0:
        return f"local finish {_at(local_finish, policy)} is {human(-slack)} after the deadline"
    return (f"local finish {_at(local_finish, policy)} leaves {human(slack)} before the "
            f"deadline, less than the {human(policy.margin.total_s)} margin")


def _at(moment: datetime, policy: Policy) -> str:
    """A moment in the deadline's own zone: the one the user thinks in."""
    return iso(moment.astimezone(policy.deadline.tzinfo))


def _local_finish(progress: Progress, rate: float | None) -> datetime | None:
    if rate is None or progress.last_snapshot is None:
        return None
    return progress.last_snapshot + timedelta(seconds=(progress.remaining or 0) / rate)


def _cloud_finish(now: datetime, remaining: int, rate: float | None,
                  policy: Policy) -> datetime | None:
    if rate is None or rate <= 0:
        return None
    return now + timedelta(seconds=policy.margin.total_s + remaining / rate)


def _base_numbers(progress: Progress, policy: Policy, now: datetime) -> dict[str, Any]:
    return {"now": iso(now), "deadline": iso(policy.deadline),
            "time_left_s": round((policy.deadline - now).total_seconds(), 1),
            "step": progress.step, "total_steps": progress.total_steps,
            "remaining_steps": progress.remaining,
            "steps_per_second": _round(progress.steps_per_second),
            "last_snapshot": iso(progress.last_snapshot) if progress.last_snapshot else None,
            "stalled": progress.stalled, **policy.margin.fields()}


def _local_numbers(progress: Progress, policy: Policy,
                   local_finish: datetime | None) -> dict[str, Any]:
    start = progress.last_snapshot
    usable = (policy.deadline - start).total_seconds() - policy.margin.total_s if start else 0
    needed = (progress.remaining or 0) / usable if usable > 0 else None
    return {"local_finish": iso(local_finish) if local_finish else None,
            "local_slack_s": (round((policy.deadline - local_finish).total_seconds(), 1)
                              if local_finish else None),
            "needed_steps_per_second": _round(needed)}


def _cloud_numbers(tier: str, finish: datetime | None, rate: float | None,
                   policy: Policy) -> dict[str, Any]:
    slack = (policy.deadline - finish).total_seconds() if finish else None
    out: dict[str, Any] = {f"{tier}_finish": iso(finish) if finish else None,
                           f"{tier}_slack_s": None if slack is None else round(slack, 1),
                           f"{tier}_steps_per_second": _round(rate)}
    if tier == "spot":
        out["spot_reserve_s"] = round(policy.spot_reserve_s, 1)
    if policy.cloud.source:
        out["cloud_source"] = policy.cloud.source
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- the latest moments to act ---------------------------------------------------------------


def burst_by(progress: Progress, policy: Policy) -> dict[str, datetime | None]:
    """If the local run stopped now, the last moments a burst could still make the deadline:
    on spot (keeping the preemption reserve) and on on-demand."""
    remaining = progress.remaining
    out: dict[str, datetime | None] = {"spot": None, "on_demand": None}
    if remaining is None:
        return out
    margin = policy.margin.total_s
    spot_rate, demand_rate = policy.cloud.rates(progress.steps_per_second)
    for tier, rate, reserve in (("spot", spot_rate, policy.spot_reserve_s),
                                ("on_demand", demand_rate, 0.0)):
        if rate:
            out[tier] = policy.deadline - timedelta(seconds=margin + reserve + remaining / rate)
    return out

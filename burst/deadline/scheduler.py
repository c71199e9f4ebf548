"""Deadline-aware backups: push the newest snapshot on a tightening cadence, decide, burst.

Each *tick* pushes the newest local snapshot and the run's environment record to the
remote store (so a burst, or a dead laptop, loses at most one interval), then asks
:func:`burst.deadline.decide` whether the local run will make the deadline, and bursts when
it will not. Every backup, decision and burst is an event in the run's history
(``schedule-backup``, ``schedule-decision``, ``schedule-burst``), which is what
``burst status`` shows and what an installed (cron / systemd) schedule reads back to know
when its last backup was.

The cadence tightens as the deadline nears: the gap is ``every``, halved whenever it
exceeds an eighth of the time left, never under ``floor``. The last hours before a deadline
are when a lost interval hurts most and when a failure leaves least time to recover.

Everything that touches the world is injected (clock, backup, progress, burster, event
recorder), so tests drive a whole schedule with a simulated clock and never sleep.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from burst import events
from burst.deadline import policy as policy_rules
from burst.deadline.handoff import Handoff
from burst.deadline.policy import Decision, Policy, Progress
from burst.deadline.timespec import iso
from burst.errors import BurstError
from burst.plan.replan import replan
from burst.snapshot import reader, sync
from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

DEFAULT_EVERY = timedelta(minutes=30)
DEFAULT_FLOOR = timedelta(minutes=5)
TIGHTEN = 8  # near the deadline: at most (time left) / TIGHTEN between backups
DUE_SLACK = timedelta(seconds=60)  # an installed timer's tick this early still counts as due

START, BACKUP, DECISION, BURST, END = ("schedule-start", "schedule-backup", "schedule-decision",
                                       "schedule-burst", "schedule-end")
HANDOFF = "schedule-handoff"  # the local run stopped or detached after a burst
PREFLIGHT = "schedule-preflight"  # would a burst work now (burst check), before each backup
EVENT_NAMES = (START, PREFLIGHT, BACKUP, DECISION, BURST, HANDOFF, END)

Burster = Callable[[str, bool], int]  # (run id, spot) -> exit code; 0: the cloud run launched
Record = Callable[..., None]  # (event name, /, **fields)
Say = Callable[[str], None]


class Clock(Protocol):
    """Wall time and waiting; the daemon's only notion of time (a fake one in tests)."""

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(seconds, 0.0))


# -- the cadence -----------------------------------------------------------------------------


def interval(time_left: timedelta, every: timedelta = DEFAULT_EVERY,
             floor: timedelta = DEFAULT_FLOOR) -> timedelta:
    """The gap before the next backup with ``time_left`` until the deadline: ``every``,
    halved until it is at most an eighth of the time left, never under ``floor``. Halving
    (30m, 15m, 7m30s, 5m) keeps the timeline a few readable steps, not a smear."""
    gap, floor = every, min(floor, every)
    while gap > floor and gap > time_left / TIGHTEN:
        gap /= 2
    return max(gap, floor)


def timeline(start: datetime, deadline: datetime, every: timedelta = DEFAULT_EVERY,
             floor: timedelta = DEFAULT_FLOOR) -> list[datetime]:
    """Every planned backup from ``start`` (included) until the deadline (excluded)."""
    moments, moment = [], start
    while moment < deadline:
        moments.append(moment)
        moment += interval(deadline - moment, every, floor)
    return moments


def segments(moments: Sequence[datetime]) -> list[tuple[datetime, datetime, timedelta, int]]:
    """Runs of equal gaps as (first, last, gap to the next, count), so a three-day timeline
    prints in a few lines. The final backup joins the run before it."""
    out: list[tuple[datetime, datetime, timedelta, int]] = []
    for index, moment in enumerate(moments):
        last = index + 1 == len(moments)
        gap = out[-1][2] if last and out else (
            timedelta(0) if last else moments[index + 1] - moment)
        if out and out[-1][2] == gap:
            first, _, _, count = out[-1]
            out[-1] = (first, moment, gap, count + 1)
        else:
            out.append((moment, moment, gap, 1))
    return out


# -- one backup ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackupResult:
    """What one scheduled backup did (the fields of its ``schedule-backup`` event)."""

    ok: bool
    step: int | None = None
    new: bool = False  # False: the store already had this snapshot
    bytes_sent: int = 0
    seconds: float = 0.0
    extra_files: int = 0  # environment, code and history files copied this time
    env: str = "present"  # or "missing": no frozen environment to send
    error: str | None = None

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def backup(local: Store, remote: Store, run_id: str) -> BackupResult:
    """Push the newest local snapshot and the run's env/ and code/ records to ``remote``.

    Never raises: a daemon that dies on a flaky network misses every later backup, so a
    failure becomes a failed ``schedule-backup`` event and the next tick tries again.
    """
    try:
        steps = reader.list_steps(local, run_id)
        if not steps:
            return BackupResult(False, error=f"no snapshot of {run_id!r} in {local.url} yet")
        transfer = sync.push_snapshot(local, remote, run_id, steps[-1])
        copied = sync.copy_extras(local, remote, run_id)
        env = "present" if _has_env(local, run_id) or _has_env(remote, run_id) else "missing"
        return BackupResult(True, steps[-1], transfer.manifest == "written",
                            transfer.bytes_sent, round(transfer.seconds, 3), copied, env)
    except Exception as error:  # the daemon outlives any one failure; the event says why
        return BackupResult(False, error=f"{type(error).__name__}: {error}")


def _has_env(store: Store, run_id: str) -> bool:
    return bool(store.list(f"{run_id}/env/"))


# -- the daemon ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """One tick's outcome."""

    at: datetime
    backup: BackupResult
    decision: Decision
    burst_code: int | None = None  # None: no burst was attempted

    @property
    def burst_ok(self) -> bool:
        return self.burst_code == 0

    @property
    def over(self) -> bool:
        """Nothing left to do: the run finished or now continues in the cloud."""
        return self.decision.action == policy_rules.DONE or self.burst_ok


@dataclass
class Scheduler:
    """Backups, decisions and at most one successful burst for one run until its deadline."""

    run_id: str
    policy: Policy
    clock: Clock
    backup: Callable[[], BackupResult]
    observe: Callable[[datetime], Progress]
    record: Record
    burster: Burster | None = None  # None: advise only (--no-burst)
    every: timedelta = DEFAULT_EVERY
    floor: timedelta = DEFAULT_FLOOR
    say: Say = field(default=lambda _msg: None)
    flush: Callable[[], object] = field(default=lambda: None)  # the history to the store
    # after a launched burst: stop or detach the local run (policy.local_run); None: only
    # advise (the lineage fence still refuses the local run's snapshots)
    handoff: Handoff | None = None
    # burst.preflight.check.for_schedule: run before each backup, recorded; None: skipped
    preflight: Callable[[], Mapping[str, Any]] | None = None

    @property
    def deadline(self) -> datetime:
        return self.policy.deadline

    def tick(self) -> Tick:
        """Back up, decide, and burst if the decision says so."""
        now = self.clock.now()
        self._preflight(now)
        result = self.backup()
        self._record(BACKUP, now, **result.fields())
        self.say(_backup_line(result))
        decision = policy_rules.decide(self.observe(now), self.policy, now)
        self._record(DECISION, now, **decision.fields())
        self.say(f"{decision.action}: {decision.reason}")
        code = None
        if decision.bursts and self.burster is not None:
            code = self._burst(now, decision, result)
        self._flush()
        return Tick(now, result, decision, code)

    def run(self) -> str:
        """Tick until the deadline, the run's end or a burst; return why it stopped."""
        self._record(START, self.clock.now(), deadline=iso(self.deadline),
                     every_s=self.every.total_seconds(), floor_s=self.floor.total_seconds(),
                     burst=self.burster is not None)
        while (now := self.clock.now()) < self.deadline:
            tick = self.tick()
            if tick.over:
                return self.end("burst" if tick.burst_ok else "finished")
            failed = tick.burst_code is not None  # a failed launch is retried soon
            gap = self.floor if failed else self.next_gap(now)
            self.clock.sleep(max((now + gap - self.clock.now()).total_seconds(), 0.0))
        return self.end("deadline")

    def run_once(self, last_backup: datetime | None) -> Tick | None:
        """One tick if one is due after ``last_backup`` (cron and systemd mode), else None.

        A timer fires on the minute while the last backup was stamped a few seconds after
        one (interpreter start-up), so "due" allows a little slack; without it every other
        firing would be skipped and the cadence would double.
        """
        now = self.clock.now()
        slack = min(DUE_SLACK, self.floor / 2)
        if last_backup is not None and now + slack < last_backup + self.next_gap(last_backup):
            return None
        return self.tick()

    def next_gap(self, moment: datetime) -> timedelta:
        return interval(self.deadline - moment, self.every, self.floor)

    def end(self, why: str) -> str:
        self._record(END, self.clock.now(), reason=why)
        return why

    def _burst(self, now: datetime, decision: Decision, result: BackupResult) -> int:
        assert self.burster is not None
        spot = decision.spot
        self.say(f"bursting {self.run_id} to the cloud on {'spot' if spot else 'on-demand'}")
        self._record(BURST, now, spot=spot, state="launching")
        self._flush()
        before = self._generation_before()
        try:
            code, error = self.burster(self.run_id, spot), None
        except Exception as exc:  # a failed launch is retried at the next tick, not fatal
            code, error = 1, f"{type(exc).__name__}: {exc}"
        fields: dict[str, Any] = {"spot": spot, "exit_code": code, "ok": code == 0,
                                  "state": "launched" if code == 0 else "failed",
                                  "step": result.step if result.ok else None,
                                  "ended": iso(self.clock.now())}
        if error:
            fields["error"] = error
        self._record(BURST, now, **fields)
        if code != 0:
            self.say(f"burst failed ({error or f'exit code {code}'}); trying again next tick")
        elif self.handoff is None:
            self.say("the run now continues in the cloud; stop the local training so that only "
                     "one copy trains (its snapshots are refused once the node takes over)")
        else:
            self._hand_over(before)
        return code

    def _preflight(self, now: datetime) -> None:
        """Check that a burst would work, before the backup a burst may follow: learnt now,
        not at the burst. Recorded and said, never fatal: a failed check is news, not a
        reason to skip the backup."""
        if self.preflight is None:
            return
        try:
            fields = dict(self.preflight())
        except Exception as error:
            fields = {"ready": None, "error": f"{type(error).__name__}: {error}"}
        self._record(PREFLIGHT, now, **fields)
        if fields.get("ready") is False:
            names = [str(p.get("name")) for p in fields.get("problems", []) if p.get("required")]
            self.say(f"preflight: a burst would not work now ({', '.join(names)}): run "
                     f"`burst check {self.run_id}`")

    def _generation_before(self) -> int | None:
        if self.handoff is None:
            return None
        try:
            return self.handoff.before()
        except Exception as error:  # the fence still holds; only the stop is at stake
            self.say(f"could not read the run's lineage: {error}")
            return None

    def _hand_over(self, before: int | None) -> None:
        """Stop or detach the local run once the node took over (policy.local_run)."""
        assert self.handoff is not None
        try:
            result = self.handoff.after(before, self.policy.local_run, self.clock)
        except Exception as error:  # never fatal: the lineage fence refuses its snapshots
            self.say(f"the run continues in the cloud; could not {self.policy.local_run} the "
                     f"local training ({type(error).__name__}: {error})")
            self._record(HANDOFF, self.clock.now(), mode=self.policy.local_run,
                         error=f"{type(error).__name__}: {error}")
            return
        self.say(f"the run now continues in the cloud: {result.line()}")
        self._record(HANDOFF, self.clock.now(), **result.fields())

    def _flush(self) -> None:
        try:
            self.flush()
        except Exception as error:  # the next backup copies the history again
            self.say(f"could not copy the run's history to the store: {error}")

    def _record(self, name: str, now: datetime, /, **fields: Any) -> None:
        self.record(name, time=now.astimezone(UTC).isoformat(timespec="milliseconds"), **fields)


def _backup_line(result: BackupResult) -> str:
    if not result.ok:
        return f"backup failed: {result.error}"
    what = "pushed" if result.new else "already in the store:"
    env = "" if result.env == "present" else " (no frozen environment: run `burst freeze`)"
    return f"backup: {what} step {result.step}{env}"


# -- one schedule per run --------------------------------------------------------------------


class Busy(BurstError):
    """Another schedule process holds this run (a long burst, or a foreground daemon)."""


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold ``lock_file`` for the duration, or raise :class:`Busy` at once.

    A burst can stream its cloud job for hours; a cron tick five minutes later must not
    decide again and launch a second copy of the run.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another `burst schedule` holds {lock_file}") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- reading the run -------------------------------------------------------------------------


def history_store(local: Store, remote: Store, run_id: str) -> Store:
    """Where the run tells its story: the local tier if it holds the run's events, else
    the remote store (a run given a remote store records its events there)."""
    if events.read(local, run_id) or not events.read(remote, run_id):
        return local
    return remote


def observer(local: Store, history: Store, run_id: str, *, total_steps: int | None = None,
             window: timedelta = policy_rules.DEFAULT_WINDOW) -> Callable[[datetime], Progress]:
    """Progress as of a moment, read from the run's newest local manifest and its events."""

    def observe(now: datetime) -> Progress:
        try:
            manifest = reader.read_manifest(local, run_id)
        except Exception:  # a half-written or unreadable manifest: the events still tell
            manifest = None
        return policy_rules.measure(events.read(history, run_id), now, total_steps=total_steps,
                                    manifest=manifest, window=window)

    return observe


def last_backup(history: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the newest scheduled backup ran (successful or not): an installed schedule's
    memory between runs."""
    for event in reversed(history):
        if event.get("event") == BACKUP:
            try:
                return datetime.fromisoformat(str(event.get("time")))
            except ValueError:
                return None
    return None


def burst_done(history: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a scheduled burst already launched the run in the cloud."""
    return any(e.get("event") == BURST and e.get("ok") for e in history)


def summary(history: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The schedule's state for ``burst status``: the newest ``schedule-*`` event of each
    kind (start, backup, decision, burst, end), or None when the run was never scheduled."""
    newest: dict[str, Any] = {}
    for event in history:
        name = str(event.get("event", ""))
        if name in EVENT_NAMES:
            newest[name.removeprefix("schedule-")] = dict(event)
    return newest or None


def describe(state: Mapping[str, Any]) -> list[str]:
    """``summary`` as lines for people: the deadline decision first, since it is the news."""
    lines = []
    decision = state.get("decision")
    if decision:
        lines.append(f"deadline {decision.get('deadline')}: {decision.get('action')}: "
                     f"{decision.get('reason')} (decided {decision.get('time')})")
    backup = state.get("backup")
    if backup:
        done = (f"step {backup.get('step')}" if backup.get("ok")
                else f"failed: {backup.get('error')}")
        lines.append(f"last scheduled backup {backup.get('time')}: {done}")
    preflight = state.get("preflight")
    if preflight and preflight.get("ready") is not True:
        what = preflight.get("error") or ", ".join(
            str(p.get("name")) for p in preflight.get("problems", []) if p.get("required"))
        lines.append(f"preflight {preflight.get('time')}: a burst would not work ({what})")
    burst = state.get("burst")
    if burst:
        tier = "spot" if burst.get("spot") else "on-demand"
        why = burst.get("error") or f"exit {burst.get('exit_code')}"
        outcome = "launched" if burst.get("ok") else f"failed ({why})"
        lines.append(f"scheduled burst on {tier} {burst.get('time')}: {outcome}")
    handoff = state.get("handoff")
    if handoff:
        lines.append(f"after the burst {handoff.get('time')}: {_handoff_line(handoff)}")
    end = state.get("end")
    if end and (not decision or str(end.get("time")) >= str(decision.get("time"))):
        lines.append(f"schedule ended {end.get('time')}: {end.get('reason')}")
    return lines


def _handoff_line(handoff: Mapping[str, Any]) -> str:
    if handoff.get("error"):
        return f"could not {handoff.get('mode')} the local run ({handoff['error']})"
    if handoff.get("node_generation") is None:
        return "the node had not taken over; the local run stops once it is fenced"
    if handoff.get("stopped"):
        return f"local run stopped (pid {', '.join(map(str, handoff['stopped']))})"
    if handoff.get("detached"):
        return f"local run detached, fenced (pid {', '.join(map(str, handoff['detached']))})"
    return "no local run was left to stop"


def margin_for(manifest: Mapping[str, Any] | None, override: timedelta | None = None
               ) -> policy_rules.Margin:
    """The burst margin for the newest snapshot's size, or the user's own figure."""
    if override is not None:
        return policy_rules.Margin(override_s=override.total_seconds())
    blobs = (manifest or {}).get("blobs") or {}
    size = sum(int(info.get("size", 0)) for info in blobs.values() if isinstance(info, dict))
    return policy_rules.estimate_margin(size)


def cloud_pace(local: Store, run_id: str, *, total_steps: int | None = None,
               cards: Sequence[str] = (), speedup: float | None = None,
               config: Mapping[str, Any] | None = None) -> policy_rules.CloudPace:
    """The cloud's predicted pace from the planner's first spot and on-demand plans (what
    ``burst resume`` would launch), or ``speedup`` x the local pace when told or unknown."""
    if speedup is not None:
        return policy_rules.CloudPace(None, None, f"assumed {speedup:g}x the local pace", speedup)
    try:
        plans = replan(local, run_id, cards=cards, total_steps=total_steps, config=config).plans
    except BurstError as error:
        return policy_rules.CloudPace(None, None, f"no plan ({error}); assumed the local pace")
    spot = _first(plans, spot=True)
    demand = _first(plans, spot=False)
    if spot is None and demand is None:
        return policy_rules.CloudPace(None, None, "the planner has no pace for this run's card; "
                                      "assumed the local pace")
    names = [f"{p.target.card.name} {tier}" for p, tier in ((spot, "spot"),
                                                            (demand, "on-demand")) if p]
    return policy_rules.CloudPace(spot.steps_per_second if spot else None,
                                  demand.steps_per_second if demand else None,
                                  f"burst plan: {', '.join(names)}")


def _first(plans: Sequence[Any], *, spot: bool) -> Any:
    return next((p for p in plans if p.fits and p.target.spot == spot and p.steps_per_second),
                None)


def recorder(store: Store, run_id: str) -> Record:
    """Append schedule events to the run's history, tagged ``source: schedule``."""

    def record(name: str, /, **fields: Any) -> None:
        events.record(store, run_id, name, source="schedule", **fields)

    return record

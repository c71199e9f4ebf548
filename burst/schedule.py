"""Deadline-aware backups: push the newest snapshot on a tightening cadence, decide, burst.

Each *tick* pushes the newest local snapshot and the run's environment record to the
remote store (so a burst, or a dead laptop, loses at most one interval), then asks
:func:`burst.deadline.decide` whether the local run will make the deadline, and bursts when
it will not. Every backup, decision and burst is an event in the run's history
(``schedule-backup``, ``schedule-decision``, ``schedule-burst``), which is what
``burst status`` shows and what an installed (cron / systemd) schedule reads back to know
when its last backup was.

The cadence tightens as the deadline nears: the gap is ``every`` until an eighth of the
time left is shorter, then that, never under ``floor``. The last hours before a deadline
are when a lost interval hurts most and when a failure leaves least time to recover.

Everything that touches the world is injected (clock, backup, progress, burster, event
recorder), so tests drive a whole schedule with a simulated clock and never sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from burst import deadline as policy_rules
from burst import events, snapshot, sync
from burst.deadline import Decision, Policy, Progress
from burst.store.base import Store
from burst.timespec import iso

DEFAULT_EVERY = timedelta(minutes=30)
DEFAULT_FLOOR = timedelta(minutes=5)
TIGHTEN = 8  # near the deadline: at most (time left) / TIGHTEN between backups

START, BACKUP, DECISION, BURST, END = ("schedule-start", "schedule-backup", "schedule-decision",
                                       "schedule-burst", "schedule-end")
EVENT_NAMES = (START, BACKUP, DECISION, BURST, END)

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
    """The gap before the next backup with ``time_left`` until the deadline."""
    return max(min(every, time_left / TIGHTEN), min(floor, every))


def timeline(start: datetime, deadline: datetime, every: timedelta = DEFAULT_EVERY,
             floor: timedelta = DEFAULT_FLOOR) -> list[datetime]:
    """Every planned backup from ``start`` (included) until the deadline (excluded)."""
    moments, moment = [], start
    while moment < deadline:
        moments.append(moment)
        moment += interval(deadline - moment, every, floor)
    return moments


def segments(moments: Sequence[datetime]) -> list[tuple[datetime, datetime, timedelta, int]]:
    """Runs of equal gaps: (first, last, gap, count), so a three-day timeline prints short."""
    out: list[tuple[datetime, datetime, timedelta, int]] = []
    for before, moment in zip(moments, moments[1:], strict=False):
        gap = moment - before
        if out and out[-1][2] == gap:
            first, _, _, count = out[-1]
            out[-1] = (first, moment, gap, count + 1)
        else:
            out.append((before, moment, gap, 2 if not out else 1))
    if not out and moments:
        out.append((moments[0], moments[0], timedelta(0), 1))
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
    env_files: int = 0  # environment / code files copied this time
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
        steps = snapshot.list_steps(local, run_id)
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

    @property
    def deadline(self) -> datetime:
        return self.policy.deadline

    def tick(self) -> Tick:
        """Back up, decide, and burst if the decision says so."""
        now = self.clock.now()
        result = self.backup()
        self._record(BACKUP, now, **result.fields())
        self.say(_backup_line(result))
        decision = policy_rules.decide(self.observe(now), self.policy, now)
        self._record(DECISION, now, **decision.fields())
        self.say(f"{decision.action}: {decision.reason}")
        if not decision.bursts or self.burster is None:
            return Tick(now, result, decision)
        return Tick(now, result, decision, self._burst(now, decision, result))

    def run(self) -> str:
        """Tick until the deadline, the run's end or a burst; return why it stopped."""
        self._record(START, self.clock.now(), deadline=iso(self.deadline),
                     every_s=self.every.total_seconds(), floor_s=self.floor.total_seconds(),
                     burst=self.burster is not None)
        while (now := self.clock.now()) < self.deadline:
            tick = self.tick()
            if tick.over:
                return self.end("burst" if tick.burst_ok else "finished")
            gap = self.floor if tick.decision.bursts else self.next_gap(now)
            self.clock.sleep(max((now + gap - self.clock.now()).total_seconds(), 0.0))
        return self.end("deadline")

    def run_once(self, last_backup: datetime | None) -> Tick | None:
        """One tick if one is due after ``last_backup`` (cron and systemd mode), else None."""
        now = self.clock.now()
        if last_backup is not None and now < last_backup + self.next_gap(last_backup):
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
        try:
            code, error = self.burster(self.run_id, spot), None
        except Exception as exc:  # a failed launch is retried at the next tick, not fatal
            code, error = 1, f"{type(exc).__name__}: {exc}"
        fields: dict[str, Any] = {"spot": spot, "exit_code": code, "ok": code == 0,
                                  "step": result.step if result.ok else None}
        if error:
            fields["error"] = error
        self._record(BURST, now, **fields)
        self.say("the run now continues in the cloud; stop the local training so that only "
                 "one copy writes snapshots" if code == 0 else
                 f"burst failed ({error or f'exit code {code}'}); trying again next tick")
        return code

    def _record(self, name: str, now: datetime, **fields: Any) -> None:
        self.record(name, time=now.astimezone(UTC).isoformat(timespec="milliseconds"), **fields)


def _backup_line(result: BackupResult) -> str:
    if not result.ok:
        return f"backup failed: {result.error}"
    what = "pushed" if result.new else "already in the store:"
    env = "" if result.env == "present" else " (no frozen environment: run `burst freeze`)"
    return f"backup: {what} step {result.step}{env}"


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
            manifest = snapshot.read_manifest(local, run_id)
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


def recorder(store: Store, run_id: str) -> Record:
    """Append schedule events to the run's history, tagged ``source: schedule``."""

    def record(name: str, /, **fields: Any) -> None:
        events.append(store, run_id, name, source="schedule", **fields)

    return record

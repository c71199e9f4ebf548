"""The bounds on a managed job's restarts, counted in the store by the nodes themselves:
errors and preemptions apart.

SkyPilot (0.14.1, ``sky/jobs/recovery_strategy.py``) recovers a managed job with no limit
when its cluster is preempted, and when the job exits with a code in
``recover_on_exit_codes``: such a code returns before ``max_restarts_on_errors`` is even
counted. burst lists 87 there (a sticky GPU failure: a new machine fixes it) and 88 (the
clean stop after a preemption notice: it usually lands before the cloud takes the machine,
and the controller, finding the cluster still up at its 5-second recheck, judges the job by
its exit code), and sets ``max_restarts_on_errors`` to 0 (nothing else is worth retrying: an
OOM is re-planned on the node, a script error fails the same way again). A card type whose
every machine fails, or a place that preempts every few minutes, would still be relaunched
forever at cloud prices, so burst bounds the restarts itself:

- each start of ``burst node run`` in a managed job claims the next record
  ``<run>/restarts/<n>.json`` (``put_if_absent``: two nodes never claim one number),
  naming SkyPilot's task id (``SKYPILOT_TASK_ID``, the same across a job's recoveries)
  and the node's rank; when it ends it writes ``<n>.end.json`` with its exit code (an
  object of its own: nothing is read and rewritten);
- the earlier records of the same task and rank are this job's restarts (every rank of a
  job starts once per attempt, so every rank counts the same and they all stop together),
  each one counted by how its attempt ended: a clean stop after a notice (88), or no end
  at all (the machine was taken with it), is a **preemption**; any other ending SkyPilot
  recovered (87) is an **error**;
- more errors than ``BURST_MAX_RESTARTS`` (``burst resume --max-restarts``), more
  preemptions than ``BURST_MAX_PREEMPTIONS`` (``--max-preemptions``), or a preempted job
  older than ``BURST_PREEMPTION_HOURS`` (``--preemption-hours``: a time budget, wall time
  since the job's first start) and the node does not train: it records a
  ``restart-limit`` event saying which bound and exits 89, a code SkyPilot does not
  recover, so the job ends there.

A new ``burst resume`` is a new managed job, with a new task id and fresh counts. A long
spot run is preempted often and loses little each time (it resumes from its last
snapshot), so preemptions get a much larger bound than errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from burst.contract import Exit
from burst.errors import ConfigError
from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

MAX_RESTARTS_ENV = "BURST_MAX_RESTARTS"
MAX_PREEMPTIONS_ENV = "BURST_MAX_PREEMPTIONS"
PREEMPTION_HOURS_ENV = "BURST_PREEMPTION_HOURS"
TASK_ENV = "SKYPILOT_TASK_ID"
RANK_ENV = "SKYPILOT_NODE_RANK"
DEFAULT_MAX_RESTARTS = 5
DEFAULT_MAX_PREEMPTIONS = 50
PREEMPTED_ENDINGS = (Exit.STOPPED,)  # a clean stop after a notice
CLAIM_TRIES = 64  # concurrent claimers (the ranks of one attempt) each move on by one
END_SUFFIX = ".end.json"


@dataclass(frozen=True)
class Bounds:
    """What a managed job may spend on restarts (None: no bound of that kind)."""

    errors: int
    preemptions: int | None = DEFAULT_MAX_PREEMPTIONS
    preemption_hours: float | None = None


@dataclass(frozen=True)
class Start:
    """One start of a node in a managed job: its record and the restarts before it."""

    task_id: str
    rank: int
    number: int  # this start's record, ``<run>/restarts/<number>.json``
    errors: int  # earlier starts of this task on this rank that ended in an error
    preemptions: int  # ... that were preempted (a clean 88, or no end at all)
    bounds: Bounds
    hours: float = 0.0  # wall time since this task's first start on this rank

    @property
    def restarts(self) -> int:
        return self.errors + self.preemptions

    @property
    def bound(self) -> int:
        return self.bounds.errors

    @property
    def why(self) -> str | None:
        """Which bound this start is past, in words; None while within them all."""
        limits = self.bounds
        if self.errors > limits.errors:
            return (f"{self.errors} restarts after errors, over the bound of {limits.errors} "
                    "(--max-restarts)")
        if limits.preemptions is not None and self.preemptions > limits.preemptions:
            return (f"{self.preemptions} preemptions, over the bound of {limits.preemptions} "
                    "(--max-preemptions)")
        if limits.preemption_hours is not None and self.preemptions and \
                self.hours > limits.preemption_hours:
            return (f"preempted {self.preemptions} times in {self.hours:.1f} h, over the "
                    f"budget of {limits.preemption_hours:g} h (--preemption-hours)")
        return None

    @property
    def over(self) -> bool:
        return self.why is not None


def prefix(run_id: str) -> str:
    return f"{run_id}/restarts/"


def record_key(run_id: str, number: int) -> str:
    return f"{prefix(run_id)}{number:06d}.json"


def end_key(run_id: str, number: int) -> str:
    return f"{prefix(run_id)}{number:06d}{END_SUFFIX}"


def bounds(environ: Mapping[str, str] | None = None) -> Bounds | None:
    """The bounds the task asked for; None where no managed job asked for any
    (``$BURST_MAX_RESTARTS`` unset)."""
    environ = os.environ if environ is None else environ
    errors = _count(environ, MAX_RESTARTS_ENV)
    if errors is None:
        return None
    preemptions = _count(environ, MAX_PREEMPTIONS_ENV)
    raw = (environ.get(PREEMPTION_HOURS_ENV) or "").strip()
    try:
        hours = float(raw) if raw else None
    except ValueError:
        hours = -1.0
    if hours is not None and not hours > 0:
        raise ConfigError(f"${PREEMPTION_HOURS_ENV} must be a positive number of hours, "
                          f"got {raw!r}")
    return Bounds(errors, DEFAULT_MAX_PREEMPTIONS if preemptions is None else preemptions,
                  hours)


def bound(environ: Mapping[str, str] | None = None) -> int | None:
    """``$BURST_MAX_RESTARTS``, or None where no managed job asked for a bound."""
    found = bounds(environ)
    return None if found is None else found.errors


def _count(environ: Mapping[str, str], name: str) -> int | None:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ConfigError(f"${name} must be a non-negative integer, got {raw!r}")
    return int(raw)


def records(store: Store, run_id: str) -> list[tuple[int, dict]]:
    """Every start record of the run, oldest first, each with ``"end"`` (its end record)
    when it has one; unreadable ones are skipped."""
    starts: dict[int, dict] = {}
    ends: dict[int, dict] = {}
    for key in store.list(prefix(run_id)):
        name = key.rsplit("/", 1)[-1]
        is_end = name.endswith(END_SUFFIX)
        stem = name.removesuffix(END_SUFFIX if is_end else ".json")
        if not stem.isdigit():
            continue
        try:
            body = json.loads(store.get(key))
        except (KeyError, ValueError):
            continue
        if isinstance(body, dict):
            (ends if is_end else starts)[int(stem)] = body
    return [(n, {**starts[n], **({"end": ends[n]} if n in ends else {})})
            for n in sorted(starts)]


def preempted(record: dict) -> bool:
    """Whether a start's attempt was preempted: it stopped cleanly after a notice, or
    never ended at all (the machine went with it)."""
    end = record.get("end")
    return end is None or end.get("returncode") in PREEMPTED_ENDINGS


def claim(store: Store, run_id: str, environ: Mapping[str, str] | None = None,
          **fields: object) -> Start | None:
    """Record this start and count the restarts before it; None outside a bounded managed
    job (no ``$SKYPILOT_TASK_ID`` or no ``$BURST_MAX_RESTARTS``: nothing restarts it)."""
    environ = os.environ if environ is None else environ
    limits, task_id = bounds(environ), environ.get(TASK_ENV)
    if limits is None or not task_id:
        return None
    rank = int(environ.get(RANK_ENV) or 0)
    existing = records(store, run_id)
    number = existing[-1][0] + 1 if existing else 0
    now = datetime.now(UTC)
    body = {"task_id": task_id, "rank": rank,
            "time": now.isoformat(timespec="milliseconds"), **fields}
    for _ in range(CLAIM_TRIES):
        if store.put_if_absent(record_key(run_id, number),
                               json.dumps(body, sort_keys=True, default=str).encode()):
            break
        number += 1
    else:
        raise ConfigError(f"could not claim a restart record under {prefix(run_id)} in "
                          f"{store.url}: {CLAIM_TRIES} numbers taken in a row")
    earlier = [r for n, r in existing if n < number and r.get("task_id") == task_id
               and int(r.get("rank") or 0) == rank]
    lost = sum(1 for r in earlier if preempted(r))
    return Start(task_id, rank, number, len(earlier) - lost, lost, limits,
                 _hours_since(earlier, now))


def finish(store: Store, run_id: str, start: Start, returncode: int) -> None:
    """Write how this start ended (its own object, so no other writer can lose it)."""
    body = {"returncode": returncode, "time": datetime.now(UTC).isoformat(
        timespec="milliseconds")}
    store.put(end_key(run_id, start.number), json.dumps(body, sort_keys=True).encode())


def _hours_since(earlier: list[dict], now: datetime) -> float:
    times = []
    for record in earlier:
        try:
            times.append(datetime.fromisoformat(str(record.get("time"))))
        except ValueError:
            continue
    return (now - min(times)).total_seconds() / 3600 if times else 0.0

"""The bound on a managed job's restarts, counted in the store by the nodes themselves.

SkyPilot (0.14.1, ``sky/jobs/recovery_strategy.py``) recovers a managed job with no limit
when its cluster is preempted, and when the job exits with a code in
``recover_on_exit_codes``: such a code returns before ``max_restarts_on_errors`` is even
counted. burst lists only 87 there (a sticky GPU failure: a new machine fixes it) and sets
``max_restarts_on_errors`` to 0 (nothing else is worth retrying: an OOM is re-planned on the
node, a script error fails the same way again). A card type whose every machine fails, or a
place that preempts every few minutes, would still be relaunched forever at cloud prices,
so burst bounds the restarts itself:

- each start of ``burst node run`` in a managed job claims the next record
  ``<run>/restarts/<n>.json`` (``put_if_absent``: two nodes never claim one number),
  naming SkyPilot's task id (``SKYPILOT_TASK_ID``, the same across a job's recoveries)
  and the node's rank;
- the earlier records of the same task and rank are this job's restarts (every rank of a
  job starts once per attempt, so every rank counts the same and they all stop together);
- more restarts than the bound (``BURST_MAX_RESTARTS``, from ``burst resume
  --max-restarts``) and the node does not train: it records a ``restart-limit`` event
  saying why and exits 89, a code SkyPilot does not recover, so the job ends there.

A new ``burst resume`` is a new managed job, with a new task id and a fresh count.
Preemptions count too: a place that keeps taking the machine away is as costly a loop as a
card that keeps failing (raise the bound for long spot runs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from burst.errors import ConfigError
from burst.store.base import Store
from burst.training import failure

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

MAX_RESTARTS_ENV = "BURST_MAX_RESTARTS"
TASK_ENV = "SKYPILOT_TASK_ID"
RANK_ENV = "SKYPILOT_NODE_RANK"
DEFAULT_MAX_RESTARTS = 5
EXIT_RESTART_LIMIT = failure.EXIT_RESTART_LIMIT  # not recovered: SkyPilot ends the job
CLAIM_TRIES = 64  # concurrent claimers (the ranks of one attempt) each move on by one


@dataclass(frozen=True)
class Start:
    """One start of a node in a managed job: its record and the restarts before it."""

    task_id: str
    rank: int
    number: int  # this start's record, ``<run>/restarts/<number>.json``
    restarts: int  # earlier starts of this task on this rank
    bound: int

    @property
    def over(self) -> bool:
        return self.restarts > self.bound


def prefix(run_id: str) -> str:
    return f"{run_id}/restarts/"


def record_key(run_id: str, number: int) -> str:
    return f"{prefix(run_id)}{number:06d}.json"


def bound(environ: Mapping[str, str] | None = None) -> int | None:
    """``$BURST_MAX_RESTARTS``, or None where no managed job asked for a bound."""
    environ = os.environ if environ is None else environ
    raw = (environ.get(MAX_RESTARTS_ENV) or "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ConfigError(f"${MAX_RESTARTS_ENV} must be a non-negative integer, got {raw!r}")
    return int(raw)


def records(store: Store, run_id: str) -> list[tuple[int, dict]]:
    """Every start record of the run, oldest first (unreadable ones are skipped)."""
    found = []
    for key in store.list(prefix(run_id)):
        stem = key.rsplit("/", 1)[-1].removesuffix(".json")
        if not stem.isdigit():
            continue
        try:
            found.append((int(stem), json.loads(store.get(key))))
        except (KeyError, ValueError):
            continue
    return sorted(found, key=lambda item: item[0])


def claim(store: Store, run_id: str, environ: Mapping[str, str] | None = None,
          **fields: object) -> Start | None:
    """Record this start and count the restarts before it; None outside a bounded managed
    job (no ``$SKYPILOT_TASK_ID`` or no ``$BURST_MAX_RESTARTS``: nothing restarts it)."""
    environ = os.environ if environ is None else environ
    limit, task_id = bound(environ), environ.get(TASK_ENV)
    if limit is None or not task_id:
        return None
    rank = int(environ.get(RANK_ENV) or 0)
    existing = records(store, run_id)
    number = existing[-1][0] + 1 if existing else 0
    body = {"task_id": task_id, "rank": rank,
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"), **fields}
    for _ in range(CLAIM_TRIES):
        if store.put_if_absent(record_key(run_id, number),
                               json.dumps(body, sort_keys=True, default=str).encode()):
            break
        number += 1
    else:
        raise ConfigError(f"could not claim a restart record under {prefix(run_id)} in "
                          f"{store.url}: {CLAIM_TRIES} numbers taken in a row")
    earlier = sum(1 for n, r in existing if n < number and r.get("task_id") == task_id
                  and int(r.get("rank") or 0) == rank)
    return Start(task_id, rank, number, earlier, limit)

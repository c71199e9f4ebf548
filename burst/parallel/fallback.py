"""Restoring on several ranks: every rank loads the same snapshot, or every rank falls back.

On several ranks rank 0 chooses the snapshot from its manifest and the sizes of its blobs
(:func:`burst.snapshot.reader.newest_complete`: hashing every blob there would have one
rank download the whole state), and each rank verifies the bytes it reads itself
(:mod:`burst.snapshot.shards`). So a corrupt or missing shard is found by the rank that
reads it, and possibly by no other: if that rank alone stopped, the others would train on
from a step it never reached, or hang in their next collective.

:func:`load_agreed` makes it one decision. Every rank tries to load the candidate; the
ranks gather who failed and why; if any did, all of them give that snapshot up together,
rank 0 finds the newest complete snapshot before it, and every rank tries that one, until
one loads on every rank. Each snapshot given up is told to ``log`` on every rank (the run
prints a warning and records a ``snapshot-skipped`` event) with the ranks that failed and
their reasons (the blob, the chunk). When no older snapshot is left, every rank raises:
starting over would lose the run.

Only snapshot damage falls back (:class:`~burst.errors.SnapshotError`, a link out of the
store). Any other failure on a rank is raised on every rank (the failing rank its own
exception, the others one naming it), never waited on in a collective that rank will not
join.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from burst.errors import LinkOutOfStoreError, SnapshotError
from burst.parallel.group import Group

T = TypeVar("T")
DAMAGE = (SnapshotError, LinkOutOfStoreError)  # what a fallback to an older snapshot cures


def load_agreed(group: Group, manifest: dict, load: Callable[[dict], T],
                older: Callable[[int], dict | None], at_step: Callable[[int], dict],
                log: Callable[[str], None]) -> tuple[dict, T]:
    """(the manifest every rank loaded, this rank's ``load`` of it).

    Every rank of ``group`` calls this with the same ``manifest`` (rank 0's choice).
    ``older(step)``, called on rank 0 only: the newest usable snapshot before ``step``
    (None: there is none). ``at_step(step)``: that snapshot's manifest on the other ranks."""
    chosen: dict | None = manifest
    step, run_id = manifest["step"], manifest["run_id"]
    while True:
        value: Any = None
        failure: list[Any] | None = None  # [reason, fatal]
        error: BaseException | None = None
        try:
            chosen = chosen if chosen is not None else at_step(step)
            value = load(chosen)
        except DAMAGE as exc:
            failure = [str(exc) or type(exc).__name__, False]
        except Exception as exc:  # raised everywhere below, not waited on
            failure, error = [f"{type(exc).__name__}: {exc}", True], exc
        failures = _gathered(group, failure)
        if not failures:
            assert chosen is not None
            return chosen, value
        why = "; ".join(f"rank {rank}: {reason}" for rank, reason, _ in failures)
        fatal = [rank for rank, _, is_fatal in failures if is_fatal]
        if fatal:
            if error is not None:
                raise error
            raise SnapshotError(f"rank(s) {', '.join(map(str, fatal))} could not restore "
                                f"snapshot {run_id}@{step}: {why}")
        found, next_step = _older(group, older, step, run_id, why)
        log(f"snapshot {run_id}@{step} is unusable ({why}); every rank falls back to "
            f"step {next_step}")
        chosen, step = found, next_step


def _gathered(group: Group, failure: list[Any] | None) -> list[tuple[int, str, bool]]:
    """Every rank's failure, on every rank: (rank, reason, fatal) for each that failed."""
    everyone = group.gather_json(failure)
    failures = group.broadcast_json(
        None if everyone is None else [[rank, *each] for rank, each in enumerate(everyone)
                                       if each is not None])
    return [(int(rank), str(reason), bool(fatal)) for rank, reason, fatal in failures]


def _older(group: Group, older: Callable[[int], dict | None], step: int, run_id: str,
           why: str) -> tuple[dict | None, int]:
    """(rank 0's manifest of the snapshot to try next, or None on the other ranks; its
    step), agreed on every rank; :class:`SnapshotError` on every rank when none is left."""
    found: dict | None = None
    answer: dict[str, Any] = {}
    if group.is_writer:
        try:
            found = older(step)
            answer = {"step": None if found is None else found["step"]}
        except DAMAGE as exc:
            answer = {"error": str(exc)}
    answer = group.broadcast_json(answer)
    if answer.get("step") is None:
        left = answer.get("error") or "the run has no older snapshot"
        raise SnapshotError(f"snapshot {run_id}@{step} is unusable ({why}), and none older "
                            f"can take its place: {left}")
    return found, int(answer["step"])

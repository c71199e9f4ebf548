"""The save side of a run's snapshots: when to take them, the tiers they go through, and
the upload behind them.

One manager for one concern, as torchtitan's checkpoint manager is: the run tells it where
it stands at each step boundary and what to describe; this decides whether a RAM shadow or
a persisted snapshot is due (the interval policy of ``burst.training.adaptive``, the spot
node's bound on lost work, the ranks' votes), captures, times burst's own work so the
policy can keep it under its budget, and hands committed snapshots to the upload queue.
Restoring is ``burst.training.restorer``'s (DCP's saver/loader split); the staging of a
copy to host RAM is ``burst.snapshot.tiers``'.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import torch

from burst.contract import Reason
from burst.env import freeze
from burst.errors import ConfigError, SnapshotError, StoreError
from burst.inputs import part as inputs_part
from burst.parallel.group import Group, StepVote
from burst.snapshot import lineage, reader, sync
from burst.snapshot import tiers as snapshot_tiers
from burst.snapshot.upload import UploadQueue
from burst.store import Store
from burst.training import adaptive, attach_guard, fencing, outage
from burst.training.guard import Guard
from burst.training.layout import positive
from burst.training.preemption import Watcher

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10
INTERVALS_EVENT = "snapshot-intervals"  # the intervals chosen from measured costs
# How long rank 0 waits for the other ranks' pieces of a sharded snapshot after its own
# is stored: they write the same share of bytes at the same time, so far more than a
# piece's upload; a rank that never reports (dead, hung) fails that snapshot, not the run.
SHARD_TIMEOUT_SECONDS = 600.0
# the persist interval of a run whose code leaves it to burst: an operator or a drill sets
# the cadence without editing the script (a value the code gives always wins)
ENV_PERSIST_SECONDS = "BURST_PERSIST_SECONDS"
# snapshots that may wait for the freeze
_ROUTINE_REASONS = (Reason.PERIODIC, Reason.MANUAL, Reason.FINAL)

Describe = Callable[[str], dict[str, Any]]  # the manifest fields of a capture, unfrozen
TakeState = Callable[[], tuple[Any, Any, Any]]  # (state tree, live tensors, boxes)


class Snapshotter:
    """Snapshot cadence, capture and storage for one run on one rank."""

    def __init__(self, store: Store, local: Store, uploads: UploadQueue | None, run_id: str,
                 group: Group, generation: lineage.Lineage | None, *, keep: int,
                 policy: adaptive.Adaptive, persist_every: int | None,
                 describe: Describe, take_state: TakeState,
                 committed: Callable[[dict], None], record: Callable[..., None],
                 stop_fenced: Callable[[], object]) -> None:
        self.store, self.local, self.uploads, self.run_id = store, local, uploads, run_id
        self._group, self._lineage = group, generation
        self._stop_fenced = stop_fenced  # leaves the process (exit 90)
        self.policy = policy  # what steps and copies are timed with (tests inject a clock)
        self.persist_every = persist_every
        self._describe, self._take_state = describe, take_state
        self._committed, self._record = committed, record
        self.watcher: Watcher | None = None  # a spot node's bound on lost work, once attached
        self.requested: str | None = None  # asked for mid-step: taken at the boundary
        self._vote = StepVote(group)  # the ranks' per-step decision, without a stall
        self._asked: str | None = None  # a request voted on, served at the next boundary
        self._own: tuple[str | None, str | None] = (None, None)  # this rank's, for the vote
        self._said: adaptive.Intervals | None = None  # the intervals last recorded
        self._step_ended: float | None = None  # clock time the previous step ended
        self._burst_seconds = 0.0  # burst's own work since then (not the step's)
        self._writes_seen = 0
        self.tiers = snapshot_tiers.Tiers(local, run_id, keep=keep, on_commit=self._on_commit,
                                          complete_meta=self.freeze_fields,
                                          stamp=generation.stamp() if generation else None)
        if group.collective:  # every rank writes its own piece (burst.snapshot.parts)
            launch = group.broadcast_json(uuid.uuid4().hex if group.rank == 0 else None)
            self.tiers.shard_into(store, group.rank, group.world_size,
                                  timeout=SHARD_TIMEOUT_SECONDS, launch=launch)

    def stop_watcher(self) -> None:
        """End the preemption watcher (a refused attach undoes the one it started)."""
        if self.watcher is not None:
            attach_guard.stop_watcher(self.watcher)
            self.watcher = None

    def step_started(self) -> None:
        """The first step's time counts from its start."""
        if self._step_ended is None:
            self._step_ended = self.policy.clock()

    def step_ended(self) -> None:
        """Feed the step's training time (burst's own work taken out) and any finished
        background write to the interval policy."""
        now = self.policy.clock()
        wrote = self.tiers.writes != self._writes_seen
        if self._step_ended is not None:  # beside a persist: what it cost training
            self.policy.step(now - self._step_ended - self._burst_seconds,
                             persisting=wrote or self.tiers.busy())
        self._step_ended, self._burst_seconds = now, 0.0
        if wrote and self.tiers.last_write_seconds is not None:
            self._writes_seen = self.tiers.writes
            self.policy.persist(self.tiers.last_write_seconds)

    def decide(self, step: int, reason: str | None, asked: str | None
               ) -> tuple[bool, bool, str | None, str | None]:
        """(persist, shadow, reason, asked) at this boundary. On several ranks every rank
        acts on the votes of the last boundary, so no rank waits for another's clock."""
        if not self._group.collective:
            return (reason is not None or self._persist_due(step),
                    self.policy.shadow_due(step), reason, asked)
        self._own = (reason, asked)
        persist, shadow, voted = self._vote.collect()
        return persist, shadow, voted, self._asked

    def boundary(self, step: int, guard: Guard) -> None:
        """At a step boundary: snapshot what is due or was asked for (mid-step, by another
        thread, by a signal), and stop once a signal came or a newer launch took over."""
        asked = guard.take_snapshot_request()  # request_snapshot, from another thread
        reason, self.requested = self.requested or asked, None
        if guard.stop_requested:
            reason = Reason.SIGNAL
        if fencing.fenced(self._lineage):  # a newer launch took over: train no further
            reason = Reason.FENCED
        persist, shadow, reason, asked = self.decide(step, reason, asked)
        if reason == Reason.FENCED:
            self._stop_fenced()
        if persist or shadow:
            self.capture(step, reason or Reason.PERIODIC, persist=persist)
            self.say_intervals(step)
        if reason == Reason.SIGNAL:  # a signal reached at least one rank: all stop here
            guard.stop_at_boundary()
        if asked is not None:  # e.g. this node is about to be preempted: store it now
            guard.store_requested()
        self.vote_next(step)  # several ranks: for the next boundary

    def store_final(self, step: int) -> StoreError | None:
        """The final snapshot, stored, every rank told the outcome; an upload that failed
        once the local tier holds the snapshot is returned for the caller to report."""
        self.drain_votes()  # the last boundary's votes: the final snapshot serves them all
        self.capture(step, Reason.FINAL, persist=True)
        try:
            self._group.settle(self.flush)  # rank 0 stores it; every rank learns the outcome
        except SnapshotError:
            if fencing.fenced(self._lineage):  # refused: a newer launch owns the run
                self._stop_fenced()
            raise
        except StoreError as exc:  # the upload, once the local tier holds the snapshot
            if self.uploads is None or not outage.kept_locally(self.local, self.run_id, step):
                raise
            return exc
        return None

    def vote_next(self, step: int) -> None:
        """On several ranks, vote for the next boundary (no stall: ``StepVote``); timed
        persists follow rank 0's clock (it measures)."""
        if not self._group.collective:
            return
        reason, self._asked = self._own
        self._vote.cast(reason is not None or (self._group.is_writer and self._persist_due(step)),
                        self.policy.shadow_due(step), reason)

    def drain_votes(self) -> None:
        """The last boundary's votes: the final snapshot serves them all."""
        self._vote.drain()

    def capture(self, step: int, reason: str, persist: bool) -> snapshot_tiers.Captured | None:
        """A RAM shadow of the state now (``persist``: written and uploaded too)."""
        entered = self.policy.clock()
        # the environment freeze is named by the persister (Tiers.complete_meta), which
        # waits for it there: the training thread never waits for a freeze
        meta = self._describe(reason)
        started = self.policy.clock()
        state_tree, live, boxes = self._take_state()
        captured = self.tiers.capture(step, state_tree, live, meta, persist=persist,
                                      boxes=boxes)  # on several ranks: this rank's piece
        done = self.policy.clock()
        self.policy.shadow(done - started)
        self._burst_seconds += done - entered  # not training time either
        if persist:
            self.policy.persisted()
        return captured

    def persist_shadow(self, reason: str, grace_seconds: float) -> int | None:
        """Queue the newest RAM copy under ``reason`` without touching the device; on
        several ranks rank 0 waits for the others' pieces at most ``grace_seconds``."""
        latest = self.tiers.latest
        if latest is None:
            return None
        sharding = self.tiers.sharding
        if sharding is not None:  # after a failure the other ranks may never send theirs
            self.tiers.sharding = replace(sharding, timeout=min(sharding.timeout,
                                                                grace_seconds))
        self.tiers.persist(replace(latest, meta={**latest.meta, "reason": reason}))
        return latest.step

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued snapshot is in the store (uploaded, for a remote one);
        raise if one failed or ``timeout`` seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.tiers.flush(timeout)
        if self.uploads is not None:
            self.uploads.flush(None if deadline is None else deadline - time.monotonic())
            sync.copy_extras(self.local, self.store, self.run_id)  # events written since

    def intervals(self) -> adaptive.Intervals:
        """The shadow and persist intervals in force (the user's, or chosen from measured
        costs), with the work a SIGKILL would lose on average."""
        return self.policy.intervals()

    def say_intervals(self, step: int) -> None:
        """Record the chosen intervals when they first exist and whenever they change by
        more than half (``burst status`` shows the newest; each snapshot's meta has them)."""
        now = self.policy.intervals()
        said = self._said
        if said is not None and not _moved(said, now):
            return
        self._said = now
        if now.chosen and now.persist_cost is not None:  # the user's need no telling
            self._record(INTERVALS_EVENT, step=step, **now.as_dict(),
                         persister_priority=self.tiers.priority)

    def freeze_fields(self, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` with the frozen environment and code named (unless it already is)."""
        if "lockfile_hash" in meta:
            return meta
        # bounded: a freeze not done in time is "pending" here and named by later snapshots;
        # a snapshot taken because something failed never waits for it
        wait = freeze.SNAPSHOT_WAIT_SECONDS if meta["reason"] in _ROUTINE_REASONS else 0.0
        frozen = freeze.freeze_run(self.store, self.run_id, local=self.local, wait=wait)
        inputs_part.refresh(self.store, self.run_id)  # read something new: staged again
        return {**meta, "lockfile_hash": frozen.lockfile_hash, "code_ref": frozen.code_ref,
                **({"freeze": "pending"} if frozen.pending else {})}

    def _persist_due(self, step: int) -> bool:
        if self.persist_every and step % self.persist_every == 0:
            return True
        interval = self.policy.intervals().persist_seconds  # the user's, or chosen
        if self.watcher is not None:  # a spot node: short enough to bound the lost work
            cost = (self.uploads.last_seconds if self.uploads else None) or 0.0
            interval = self.watcher.persist_seconds(interval, cost)
        return self.policy.persist_due(interval)

    def _on_commit(self, manifest: dict) -> None:
        self._committed(manifest)
        self._record("snapshot", step=manifest["step"], reason=manifest["reason"])
        if self.uploads is None:
            return
        if reader.is_sharded(manifest):  # already in the store
            sync.copy_extras(self.local, self.store, self.run_id)  # events written since
        else:
            self.uploads.submit(manifest["step"])


def manifest_fields(reason: str, *, counters: dict[str, Any], batch: dict[str, Any],
                    amp: str | None, sampler: dict | None, peaks: dict[str, int],
                    intervals: adaptive.Intervals) -> dict[str, Any]:
    """The manifest fields of a capture, before the environment freeze is named
    (:meth:`Snapshotter.freeze_fields`): where the run stands, how it splits its batch,
    in which precision, on what software and card, and the intervals in force."""
    return {
        "reason": reason,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "counters": counters,
        "batch": batch,
        "amp": {"dtype": amp},
        "sampler": sampler,
        "versions": {"torch": torch.__version__, "python": platform.python_version(),
                     "cuda": torch.version.cuda, "platform": sys.platform},
        "card": _card_name(),
        "memory": {"peak_bytes_by_micro_batch": dict(peaks)},
        "intervals": intervals.as_dict(),
    }


def _card_name() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_device_name()
    return "cpu"


def interval_policy(shadow_every: int | None, persist_every: int | None,
                    persist_seconds: float | str | None, overhead_budget: float,
                    clock: Callable[[], float]) -> adaptive.Adaptive:
    """The interval policy for the intervals a run gave (each checked, in this order);
    those left out are chosen from measured costs (``burst.training.adaptive``), the
    persist interval from ``$BURST_PERSIST_SECONDS`` when the code leaves it to burst."""
    shadow_every = None if shadow_every is None else positive(shadow_every, "shadow_every")
    persist_every = None if persist_every is None else positive(persist_every,
                                                                "persist_every")
    if persist_seconds == adaptive.AUTO and persist_every is None \
            and os.environ.get(ENV_PERSIST_SECONDS):
        persist_seconds = seconds_from_env(ENV_PERSIST_SECONDS,
                                           os.environ[ENV_PERSIST_SECONDS])
    persist_seconds = _persist_seconds(persist_seconds)
    return adaptive.Adaptive(
        _budget(overhead_budget), shadow_every=shadow_every,
        persist_seconds=None if isinstance(persist_seconds, str) else persist_seconds,
        persist_chosen=persist_seconds == adaptive.AUTO and persist_every is None,
        clock=clock)


def seconds_from_env(name: str, text: str) -> float:
    """A persist interval an operator set in ``$name``."""
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"${name} must be a number of seconds, got {text!r}") from None


def _persist_seconds(value: float | str | None) -> float | str | None:
    if value is None or value == adaptive.AUTO:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"persist_seconds must be a positive number, None or "
                          f"{adaptive.AUTO!r}, got {value!r}")
    return float(value)


def _budget(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"overhead_budget is a fraction of training time (0.01 is 1%), "
                          f"got {value!r}")
    return float(value)


def _moved(said: adaptive.Intervals, now: adaptive.Intervals) -> bool:
    """Whether the intervals changed enough to say so again (by more than half)."""
    if (said.persist_cost is None) != (now.persist_cost is None):
        return True
    pairs = [(said.shadow_every, now.shadow_every), (said.persist_seconds, now.persist_seconds)]
    return any((a is None) != (b is None) or (a and b and not 0.5 <= b / a <= 2)
               for a, b in pairs)

"""The background stager: a run's parts go to the store while it trains, behind snapshots.

Started by a :class:`burst.Run` on the rank that uploads snapshots (rank 0, with a remote
store), right after its environment freeze; a daemon thread that walks the parts
(:mod:`burst.env.stageparts`) in order, uploading what the store lacks within a
:class:`burst.env.throttle.TokenBucket` that pauses while a snapshot uploads. After each
pass, and every :data:`POLL_SECONDS` once everything is there, it publishes the run's
readiness (:mod:`burst.env.readiness`) to the run's local state, and to its history when
the run becomes ready or stops being so.

It never stops training: an error is one warning and a ``stage-failed`` event, and the
pass is tried again after :data:`RETRY_SECONDS`. :meth:`Stager.stop` only sets an event
(the run's close and its emergency snapshot never wait for a wheel to finish); the
thread ends at its next chunk of tokens or its next object. A file:// store is this
machine's disk: nothing is staged, and the run counts as ready.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from burst import events
from burst.env import readiness, stageparts, throttle
from burst.env.lockfile import Lockfile
from burst.env.readiness import Readiness
from burst.errors import BurstError
from burst.redact import scrub_text
from burst.snapshot import priority, traffic
from burst.staging.parts import Part, Pending
from burst.store import is_local
from burst.store.base import Store

STAGE_ENV = "BURST_STAGE"  # 0: never stage in the background
POLL_SECONDS = 30.0  # how often a ready run looks again (a new input, a deleted object)
RETRY_SECONDS = 60.0
BUSY_SECONDS = 1.0  # between passes while something is still missing
LOCAL_ONLY = "the store is this machine's disk"


class StageWarning(UserWarning):
    """Pre-staging failed for a while; training goes on, a burst would upload more."""


Publish = Callable[[Readiness], None]


class Stager:
    """One run's background staging."""

    def __init__(self, store: Store, run_id: str, parts: list[Part], *,
                 state: Store | None = None, bucket: throttle.TokenBucket | None = None,
                 on_readiness: Publish | None = None, poll: float = POLL_SECONDS) -> None:
        self.store, self.run_id, self.parts = store, run_id, parts
        self.state = state  # where the local readiness record goes (the local tier)
        self.stop_event = threading.Event()
        self.bucket = bucket or throttle.TokenBucket(throttle.configured(),
                                                     stop=self.stop_event)
        self.bucket.stop = self.stop_event
        self.on_readiness, self.poll = on_readiness, poll
        self.last: Readiness | None = None
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None

    def start(self) -> Stager:
        # at idle priority: the training step keeps its cores (burst.snapshot.priority)
        self._thread = priority.start_idle(self._work, name="burst-stage")
        return self

    def stop(self) -> None:
        """Ask the thread to end; returns at once."""
        self.stop_event.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def pendings(self) -> list[Pending]:
        return [part.pending(self.store) for part in self.parts]

    def run_once(self) -> Readiness:
        """One pass: stage every part that lacks something, then publish. (The thread
        runs this in a loop; tests call it directly.)"""
        if self.last is None:
            self.publish()  # what is missing, before the first (maybe long) pass
        for part in self.parts:
            if self.stop_event.is_set():
                break
            if not part.pending(self.store).ready:
                part.stage(self.store, self.bucket, self.stop_event)
                self.publish()  # a big part done: status sees the progress
        return self.publish()

    def readiness(self) -> Readiness:
        pendings = self.pendings()
        return readiness.estimate(pendings, traffic.uplink(), self._wheel_bytes())

    def publish(self) -> Readiness:
        """Compute the readiness now and leave it where status, check and the exporter
        read it; record a change between ready and not in the history."""
        now = self.readiness()
        changed = self.last is None or self.last.ready != now.ready
        self.last = now
        if self.state is not None:
            with contextlib.suppress(BurstError, OSError):
                readiness.save(self.state, self.run_id, now)
        if self.on_readiness is not None:
            with contextlib.suppress(Exception):
                self.on_readiness(now)
        if changed:
            events.record(self.store, self.run_id, "readiness", say=lambda _m: None,
                          ready=now.ready, pending_bytes=now.pending_bytes,
                          pending_objects=now.pending_objects, line=now.line())
        return now

    def _wheel_bytes(self) -> int:
        for part in self.parts:
            house = getattr(getattr(part, "wheels", None), "built", lambda: None)()
            if house is not None:
                return house.bytes
        return 0

    def _work(self) -> None:
        while not self.stop_event.is_set():
            try:
                now = self.run_once()
            except Exception as error:  # never the run's problem: say it, try again
                self._failed(error)
                self.stop_event.wait(RETRY_SECONDS)
                continue
            self.stop_event.wait(self.poll if now.ready else BUSY_SECONDS)

    def _failed(self, error: Exception) -> None:
        detail = str(error) if isinstance(error, BurstError) else f"{type(error).__name__}: " \
                                                                   f"{error}"
        message = scrub_text(f"burst could not pre-stage the run's environment: {detail}")
        if message not in self.errors:
            self.errors.append(message)
            warnings.warn(message + " (training continues; it is retried)", StageWarning,
                          stacklevel=2)
        with contextlib.suppress(Exception):
            events.record(self.store, self.run_id, "stage-failed", say=lambda _m: None,
                          error=message)


def enabled() -> bool:
    return os.environ.get(STAGE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def start_for_run(store: Store, run_id: str, *, local: Store | None,
                  lock: Callable[[], Lockfile], code_dir: Path, exclude: list[Path],
                  on_readiness: Publish | None = None) -> Stager | None:
    """The stager of a training run (the snapshot-uploading rank calls this), started;
    None when there is nothing to stage: a local store (its readiness is published as
    ready), or ``$BURST_STAGE=0``."""
    if is_local(store):
        ready = readiness.estimate([], None, 0, staging=LOCAL_ONLY)
        # written beside training, never in its thread: a slow or hung disk must not hold
        # up the run's start for a record that only says "ready"
        threading.Thread(target=_save_quietly, args=(store, run_id, ready),
                         name="burst-readiness", daemon=True).start()
        if on_readiness is not None:
            on_readiness(ready)
        return None
    if not enabled():
        return None
    context = stageparts.Context(run_id, lock, code_dir, exclude)
    return Stager(store, run_id, stageparts.parts_for(context), state=local,
                  on_readiness=on_readiness).start()


def _save_quietly(store: Store, run_id: str, ready: Readiness) -> None:
    with contextlib.suppress(BurstError, OSError):
        readiness.save(store, run_id, ready)


def for_run(store: Store, run_id: str, local: Store | None,
            on_readiness: Publish | None = None) -> Stager | None:
    """:func:`start_for_run` for a :class:`burst.Run`, after its freeze has started: the
    parts are made from the freeze's lockfile and project, and the wheelhouse is left to
    the stager (throttled) instead of the freeze's upload thread."""
    from burst.env import freeze

    if not is_local(store) and enabled():
        freeze.leave_wheelhouse_to_stager(store, run_id)
    code_dir = freeze.default_code_dir()
    roots = [Path(r) for r in (getattr(s, "root", None) for s in (store, local))
             if isinstance(r, str | os.PathLike)]
    return start_for_run(store, run_id, local=local,
                         lock=lambda: freeze.frozen_lockfile(store, run_id, local),
                         code_dir=code_dir, exclude=roots, on_readiness=on_readiness)

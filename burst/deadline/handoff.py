"""After a scheduled burst: make the cloud node the run's only writer.

The burst launches the run on a node, but the local training keeps going, under the same
run id. The store's lineage fence (:mod:`burst.snapshot.lineage`) already refuses its
snapshots from the moment the node takes its generation; what is left is the local
process itself, by the policy's ``local_run`` (:mod:`burst.deadline.policy`):

* ``stop`` (default): once the node has taken over (a generation newer than the one
  current before the burst), SIGTERM the local training processes that hold older
  generations on this machine. Each stops at its next step boundary; its final snapshot
  is refused by the fence, which is the point: the node's lineage is the run now.
  Stopping only after the takeover matters: a node that never comes up must not leave the
  run with no writer at all.
* ``detach``: leave it running. A local run that uploads to the node's store itself is
  fenced: its next commit there is refused and it then stops on its own (exit
  ``Exit.FENCED``). One that writes only a local store (the schedule uploading for it) is
  not fenced, but nothing of it reaches the remote store any more (the schedule's backups
  end with the burst, and a push of its snapshots would be refused as stale).

The local processes are found in the generation records: the remote store's generations
older than the node's, and every generation of the local store when it is another store.

A process is signalled only when its generation record names this host and its pid still
belongs to the same process (start time and boot), never on the strength of a pid alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Protocol

from burst.deadline.policy import LOCAL_DETACH, LOCAL_STOP, local_run_mode
from burst.snapshot import lineage
from burst.store.base import Store

DEFAULT_WAIT = timedelta(minutes=30)  # provisioning, installing, pulling: the burst margin
DEFAULT_POLL = timedelta(seconds=10)


class Clock(Protocol):
    def now(self) -> Any: ...

    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class HandoffResult:
    """What the handoff did (the fields of the ``schedule-handoff`` event)."""

    mode: str
    node_generation: int | None  # None: the node had not taken over within the wait
    stopped: tuple[int, ...] = ()  # pids sent SIGTERM
    detached: tuple[int, ...] = ()  # local pids left running, fenced

    def fields(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def line(self) -> str:
        if self.node_generation is None:
            return ("the node has not taken the run over yet; the local run keeps going and "
                    "will stop by itself once the node's first snapshot fences it")
        taken = f"the node took the run over (generation {self.node_generation})"
        if self.stopped:
            return f"{taken}; stopping the local training (pid {_pids(self.stopped)})"
        if self.detached:
            return (f"{taken}; the local training (pid {_pids(self.detached)}) is detached: "
                    "none of its snapshots reaches the store any more")
        return f"{taken}; no local training of this run is running here"


@dataclass
class Handoff:
    """The handoff for one run in its (remote) store."""

    store: Store  # the remote store the node resumes from and takes its generation in
    run_id: str
    wait: timedelta = DEFAULT_WAIT
    poll: timedelta = DEFAULT_POLL
    # the local store, when the local training writes there and the schedule uploads: its
    # generations are all the local run's (that run is not fenced, so only ``stop`` ends it)
    local: Store | None = None

    def before(self) -> int | None:
        """The newest generation now, before the burst (the local run's, if it has one)."""
        return lineage.newest(self.store, self.run_id)

    def after(self, before: int | None, mode: str, clock: Clock) -> HandoffResult:
        """Wait for the node's generation, then stop or detach the older local launches."""
        local_run_mode(mode)
        node = self._wait_for_node(before, clock)
        if node is None:
            return HandoffResult(mode, None)
        local = self._local_processes(node)
        if mode == LOCAL_DETACH:
            return HandoffResult(mode, node, detached=local)
        assert mode == LOCAL_STOP
        stopped = []
        for pid in local:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
                stopped.append(pid)
        return HandoffResult(mode, node, stopped=tuple(stopped))

    def _local_processes(self, node: int) -> tuple[int, ...]:
        """Pids on this machine holding generations older than the node's."""
        held = [r for r in lineage.records(self.store, self.run_id) if r[lineage.FIELD] < node]
        if self.local is not None and self.local.url != self.store.url:
            held += lineage.records(self.local, self.run_id)
        pids = {int(r["pid"]) for r in held if lineage.same_process(r)}
        return tuple(sorted(pids - {0, 1, os.getpid()}))

    def _wait_for_node(self, before: int | None, clock: Clock) -> int | None:
        until = clock.now() + self.wait
        while True:
            top = lineage.newest(self.store, self.run_id)
            if top is not None and (before is None or top > before):
                return top
            if clock.now() >= until:
                return None
            clock.sleep(self.poll.total_seconds())


def _pids(pids: tuple[int, ...]) -> str:
    return ", ".join(str(p) for p in pids)

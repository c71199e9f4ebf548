"""The machine-local coordinator: GPU memory quotas and priorities for runs sharing a card.

Each ``burst run --gpu-memory-quota`` agent holds a *claim* in a small SQLite registry in
a per-user directory (``$BURST_COORDINATOR_DIR``, else ``$XDG_RUNTIME_DIR/burst``, else
``~/.cache/burst``). There is no daemon: every agent reads and writes the registry in
short ``BEGIN IMMEDIATE`` transactions, so two agents never decide on the same view.

A claim is (run id, agent pid and its start time, quota bytes, priority, state). Memory is
held by ``running`` claims; ``waiting`` (not started yet) and ``paused`` claims hold none.
A run may start when its quota fits beside the running claims and no waiting claim of a
higher priority (or of the same priority, waiting longer) is ahead of it. When it does not
fit, lower-priority running claims are marked *pause requested*: their agents stop the
child at a step boundary with a snapshot and wait, and start it again (resuming exactly)
once the memory is free. A claim whose pid is dead, or whose pid now names another process
(different start time), is dropped on every read, so a killed run never blocks the rest.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from burst.errors import ConfigError

DIR_ENV = "BURST_COORDINATOR_DIR"
CAPACITY_ENV = "BURST_GPU_CAPACITY"  # a modelled card size (tests, or a share of a card)
POLL_ENV = "BURST_COORDINATOR_POLL"  # seconds between an agent's looks at the registry
PRIORITIES = {"low": 0, "normal": 1, "high": 2}
STATES = ("waiting", "running", "paused")
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_SCHEMA = """CREATE TABLE IF NOT EXISTS claims (
    run_id TEXT PRIMARY KEY, pid INTEGER NOT NULL, pid_start TEXT NOT NULL,
    quota INTEGER NOT NULL, priority INTEGER NOT NULL, state TEXT NOT NULL,
    pause_requested INTEGER NOT NULL DEFAULT 0, since REAL NOT NULL)"""


@dataclass(frozen=True)
class Claim:
    run_id: str
    pid: int
    pid_start: str
    quota: int
    priority: int
    state: str
    pause_requested: bool
    since: float

    @property
    def priority_name(self) -> str:
        return {v: k for k, v in PRIORITIES.items()}.get(self.priority, str(self.priority))

    def as_dict(self) -> dict:
        return {"run": self.run_id, "pid": self.pid, "quota": self.quota,
                "priority": self.priority_name, "state": self.state,
                "pause_requested": self.pause_requested, "since": self.since}


def parse_size(text: str) -> int:
    """``40GiB``, ``6G``, ``512MiB``, ``1000000`` -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(f"not a memory size: {text!r} (e.g. 40GiB, 512MiB, 6G)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"a memory size must be positive, got {text!r}")
    return size


def parse_priority(name: str) -> int:
    if name not in PRIORITIES:
        raise ConfigError(f"priority must be one of {', '.join(PRIORITIES)}, got {name!r}")
    return PRIORITIES[name]


def default_directory() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "burst" if runtime else Path.home() / ".cache" / "burst"


def machine_capacity() -> int | None:
    """The memory runs share: ``$BURST_GPU_CAPACITY``, else the first card's total (NVML),
    else None (no GPU seen: nothing to share, so nobody is ever paused)."""
    if os.environ.get(CAPACITY_ENV):
        return parse_size(os.environ[CAPACITY_ENV])
    from burst.supervise.gpuwatch import Nvml

    try:
        nvml = Nvml()
    except RuntimeError:
        return None
    try:
        samples = nvml.sample()
        return samples[0].memory_total if samples else None
    finally:
        nvml.close()


def poll_seconds() -> float:
    raw = os.environ.get(POLL_ENV, "")
    try:
        return max(float(raw), 0.01) if raw else 1.0
    except ValueError:
        raise ConfigError(f"${POLL_ENV} must be a number of seconds, got {raw!r}") from None


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, from /proc), "" where /proc is
    missing, None when the process is gone: a pid reused by another process has another
    start time, so its old claim is seen as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else _alive_without_proc(pid)
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if fields and fields[0] == "Z":  # a zombie holds no memory
        return None
    return fields[19] if len(fields) > 19 else ""


def _alive_without_proc(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return ""
    return ""


class Coordinator:
    """The registry of one machine's claims; every method is one short transaction."""

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 capacity: int | None = None) -> None:
        self.directory = Path(directory) if directory else default_directory()
        self.capacity = capacity
        self.path = self.directory / "claims.sqlite"

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(_SCHEMA)
            _drop_stale(connection)
            yield connection
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        finally:
            connection.close()

    def register(self, run_id: str, quota: int, priority: int, pid: int | None = None) -> None:
        """Add a waiting claim for ``run_id`` held by ``pid`` (this process by default)."""
        if self.capacity is not None and quota > self.capacity:
            raise ConfigError(f"a quota of {quota} bytes is more than this machine's "
                              f"{self.capacity} bytes")
        pid = os.getpid() if pid is None else pid
        start = process_start(pid)
        if start is None:
            raise ConfigError(f"process {pid} is not running")
        with self._transaction() as db:
            held = db.execute("SELECT pid FROM claims WHERE run_id = ?", (run_id,)).fetchone()
            if held:
                raise ConfigError(f"run {run_id} already holds a claim on this machine "
                                  f"(agent pid {held[0]})")
            db.execute("INSERT INTO claims VALUES (?, ?, ?, ?, ?, 'waiting', 0, ?)",
                       (run_id, pid, start, quota, priority, time.time()))

    def acquire(self, run_id: str) -> bool:
        """Start ``run_id`` if its quota fits and nobody is ahead of it (then True); else ask
        lower-priority running claims to pause when that would make room, and say False."""
        with self._transaction() as db:
            claims = _read(db)
            mine = next((c for c in claims if c.run_id == run_id), None)
            if mine is None:
                raise ConfigError(f"run {run_id} holds no claim on this machine")
            if mine.state == "running":
                return True
            others = [c for c in claims if c.run_id != run_id]
            if any(_ahead(c, mine) for c in others):
                return False
            running = [c for c in others if c.state == "running"]
            used = sum(c.quota for c in running)
            if self.capacity is None or used + mine.quota <= self.capacity:
                db.execute("UPDATE claims SET state = 'running', pause_requested = 0 "
                           "WHERE run_id = ?", (run_id,))
                return True
            for victim in _victims(running, mine, used, self.capacity):
                db.execute("UPDATE claims SET pause_requested = 1 WHERE run_id = ?",
                           (victim.run_id,))
            return False

    def pause_requested(self, run_id: str) -> bool:
        with self._transaction() as db:
            row = db.execute("SELECT pause_requested FROM claims WHERE run_id = ?",
                             (run_id,)).fetchone()
        return bool(row and row[0])

    def paused(self, run_id: str) -> None:
        """The run's child stopped at a boundary: its memory is free, it waits to go on."""
        with self._transaction() as db:
            db.execute("UPDATE claims SET state = 'paused', pause_requested = 0, since = ? "
                       "WHERE run_id = ?", (time.time(), run_id))

    def wait(self, run_id: str, poll: float, sleep: Callable[[float], None] = time.sleep
             ) -> float:
        """Until ``run_id`` may run (see :meth:`acquire`); the seconds waited."""
        started = time.monotonic()
        while not self.acquire(run_id):
            sleep(poll)
        return time.monotonic() - started

    def release(self, run_id: str, pid: int | None = None) -> None:
        """Drop the claim ``pid`` (this process by default) holds for ``run_id``; never
        another agent's claim under the same run id."""
        pid = os.getpid() if pid is None else pid
        with self._transaction() as db:
            db.execute("DELETE FROM claims WHERE run_id = ? AND pid = ?", (run_id, pid))

    def claims(self) -> list[Claim]:
        """Every live claim, highest priority first."""
        if not self.path.exists():
            return []
        with self._transaction() as db:
            claims = _read(db)
        return sorted(claims, key=lambda c: (-c.priority, c.since))


def _read(db: sqlite3.Connection) -> list[Claim]:
    rows = db.execute("SELECT run_id, pid, pid_start, quota, priority, state, "
                      "pause_requested, since FROM claims").fetchall()
    return [Claim(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7]) for r in rows]


def _drop_stale(db: sqlite3.Connection) -> None:
    for claim in _read(db):
        start = process_start(claim.pid)
        if start is None or (start and claim.pid_start and start != claim.pid_start):
            db.execute("DELETE FROM claims WHERE run_id = ?", (claim.run_id,))


def _ahead(other: Claim, mine: Claim) -> bool:
    """Another claim waiting for memory goes first: a higher priority, or the same one
    waiting since earlier."""
    if other.state == "running":
        return False
    return (other.priority, -other.since) > (mine.priority, -mine.since)


def _victims(running: list[Claim], mine: Claim, used: int, capacity: int) -> list[Claim]:
    """The lower-priority running claims to pause (lowest priority, newest first) so that
    ``mine`` fits; none when even pausing all of them would not make room."""
    freed = sum(c.quota for c in running if c.pause_requested)
    candidates = sorted((c for c in running if c.priority < mine.priority
                         and not c.pause_requested), key=lambda c: (c.priority, -c.since))
    chosen: list[Claim] = []
    for claim in candidates:
        if used - freed + mine.quota <= capacity:
            break
        chosen.append(claim)
        freed += claim.quota
    return chosen if used - freed + mine.quota <= capacity else []


@dataclass(frozen=True)
class Share:
    """What an agent asks of the machine: its quota and priority, and how often it looks."""

    coordinator: Coordinator
    quota: int
    priority: int
    poll: float = 1.0


class PauseWatch:
    """While a child runs: look at the registry every ``poll`` seconds and call
    ``on_pause`` once when this run's claim is asked to pause."""

    def __init__(self, share: Share, run_id: str, on_pause: Callable[[], None]) -> None:
        self.share, self.run_id, self.on_pause = share, run_id, on_pause
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="burst-pause-watch",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.share.poll):
            if self.share.coordinator.pause_requested(self.run_id):
                self.fired = True
                self.on_pause()
                return

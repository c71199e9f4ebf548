"""Lineages: which launch of a run may still publish snapshots (the split-brain fence).

A run can have two writers: ``burst schedule`` bursts to the cloud while the local training
keeps going, or a node thought dead is still alive next to its replacement. Both write
snapshots under the same run id, and whichever is further along would take the "newest"
slot that every resume reads. Fencing makes the newest launch the only one that counts.

**Generations.** Every launch that starts writing (each :class:`burst.Run`: the local
training process, the resumed one on a node) takes the next *generation* of the run in its
store: ``<run>/lineage/<generation, 10 digits>.json``, created with
:meth:`Store.put_if_absent`, so two launches can never hold the same number (the loser of a
race lists again and takes the next one). The record says which process holds it (host,
pid, the process's start time), which is what lets ``burst schedule`` stop the local run
after a burst (:mod:`burst.deadline.handoff`). A launch takes its generation *before* it
reads the newest snapshot to resume from, which is what the re-check below relies on.

Each snapshot's manifest carries the generation of the launch that took it
(``"generation"``) and the random token of that generation's record (``"lineage"``): the
numbers count per store, so the token tells a generation of this store from one of another
store (a local store whose snapshots ``burst schedule`` uploads). Snapshots older than
fencing carry neither; they stay readable and are never refused.

**The fence** (:func:`check`), applied by :func:`burst.snapshot.commit.commit` right
before the manifest write and again right after it, with one ``LIST`` of
``<run>/lineage/`` each time (per commit, never per training step):

* a manifest of generation *g* is published while *g* is the newest generation;
* if *g* belongs to a launch in this process and a newer generation exists, that launch
  is *fenced*: the commit is refused (no manifest is written) and the launch's
  :attr:`Lineage.fenced_by` says by whom, so the training loop stops at its next step
  boundary (exit code ``Exit.FENCED``, :mod:`burst.contract`);
* a snapshot a crashed predecessor left un-uploaded (generation *g*, pushed by this
  process's launch *h* > *g*) still goes up if *h* is the newest generation and no launch
  came between them (*g* < *k* < *h*): a restart on the same machine keeps its catch-up
  upload, a snapshot of a lineage a burst already replaced does not;
* with no launch of this process (``burst push``, the scheduler's backups) a manifest of
  an older generation is stale and is refused;
* a manifest stamped by another store's lineage is not judged here (fencing is per store:
  a launch is fenced in the store it writes).

**The window.** A newer launch can take its generation between the check and the manifest
write. The manifest then lands, and the writer's re-check right after it (one ``LIST``
later) sees the newer generation and deletes it again (with ``put_if_absent`` the manifest
this commit wrote is its own; with an overwrite, only while the bytes are still its own).
While it was visible the newer launch may have read it: a launch takes its generation
before it reads the newest snapshot, so it then resumed *from* that manifest, a complete
snapshot, and its history is still one history; only the store's copy of its starting
point goes away (the launch has restored it, and its own next snapshot supersedes it). A
stale manifest that lands after the newer launch read the store is never resumed from, and
the re-check removes it. What is left: a writer that dies between its manifest write and
its re-check (one round trip) leaves that one manifest visible: a complete snapshot, at
most one per fenced writer, the newest only until the newer lineage commits a later step.
Stores are assumed to list what was written before (S3, OSS, GCS and local directories are
strongly consistent).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from burst.errors import SnapshotError
from burst.store.base import Store
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry

DIRECTORY = "lineage"
FIELD = "generation"  # the manifest field naming the generation that took the snapshot
TOKEN = "lineage"  # the manifest field naming that generation's record (its random token)
_NAME = re.compile(r"^(\d{10})\.json$")
TAKE_ATTEMPTS = 64  # lost races before giving up (each loss means another launch won one)
# Records are named with 10 digits, and only such names are listed: a generation past this
# one would be written, never listed, so every launch after it would run unfenced.
MAX_GENERATION = 10**10 - 1


class FencedError(SnapshotError):
    """A commit refused because a newer launch of the run took over."""

    def __init__(self, run_id: str, generation: int, newer: int, *, own: bool) -> None:
        self.run_id, self.generation, self.newer, self.own = run_id, generation, newer, own
        if own:
            message = (f"run {run_id!r}: this process's launch (generation {generation}) was "
                       f"replaced by generation {newer}; its snapshot is refused so that only "
                       "the newest launch writes the run")
        else:
            message = (f"run {run_id!r}: a snapshot of generation {generation} is stale "
                       f"(generation {newer} took over since); not publishing it")
        super().__init__(message)


def key(run_id: str, generation: int) -> str:
    if not 0 < generation <= MAX_GENERATION:
        raise SnapshotError(f"run {run_id!r}: generation {generation} is not a generation "
                            f"number (1 to {MAX_GENERATION})")
    return f"{run_id}/{DIRECTORY}/{generation:010d}.json"


def generations(store: Store, run_id: str, policy: RetryPolicy = DEFAULT_RETRY) -> list[int]:
    """Every generation taken in ``store`` for ``run_id``, sorted (one ``LIST``)."""
    prefix = f"{run_id}/{DIRECTORY}/"
    found = []
    for name in retry(lambda: store.list(prefix), policy):
        match = _NAME.match(name[len(prefix):])
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def newest(store: Store, run_id: str) -> int | None:
    """The newest generation of ``run_id``, or None when no launch took one."""
    taken = generations(store, run_id)
    return taken[-1] if taken else None


def records(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The generation records (oldest first); one that cannot be read is skipped."""
    out = []
    for generation in generations(store, run_id):
        try:
            record = json.loads(store.get(key(run_id, generation)))
        except (KeyError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            out.append({**record, FIELD: generation})
    return out


def generation_of(manifest: Mapping[str, Any]) -> int | None:
    """The generation a manifest was taken by; None for snapshots older than fencing."""
    value = manifest.get(FIELD)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


# -- one launch's generation -------------------------------------------------------------------


@dataclass(eq=False)
class Lineage:
    """This process's hold on one generation of a run in one store."""

    store: Store
    run_id: str
    generation: int
    token: str  # random, in the generation's record: tells this store's lineage from another's
    fenced_by: int | None = None  # set (by any commit thread) once a newer launch is seen

    def stamp(self) -> dict[str, Any]:
        """The manifest fields that say which launch took a snapshot."""
        return {FIELD: self.generation, TOKEN: self.token}

    def guards(self, store: Store) -> bool:
        """Whether commits into ``store`` are fenced by this lineage (its own store)."""
        return store is self.store or store.url == self.store.url


def take(store: Store, run_id: str, *, policy: RetryPolicy = DEFAULT_RETRY) -> Lineage:
    """Take the next generation of ``run_id`` in ``store`` and register it in this process.

    ``put_if_absent`` decides every race: the loser lists again and tries the next number.
    """
    token = uuid.uuid4().hex
    record = json.dumps({**process_record(), "token": token}, sort_keys=True).encode()
    candidate = (newest(store, run_id) or 0) + 1
    for _ in range(TAKE_ATTEMPTS):
        _check_room(store, run_id, candidate)
        if retry(lambda c=candidate: store.put_if_absent(key(run_id, c), record), policy):
            lineage = Lineage(store, run_id, candidate, token)
            _register(lineage)
            return lineage
        candidate = max(candidate + 1, (newest(store, run_id) or 0) + 1)
    raise SnapshotError(f"run {run_id!r}: could not take a generation in {store.url} after "
                        f"{TAKE_ATTEMPTS} tries (other launches keep taking them)")


def _check_room(store: Store, run_id: str, candidate: int) -> None:
    """Refuse to start a launch whose generation could never be listed (and so fenced)."""
    if candidate > MAX_GENERATION:
        raise SnapshotError(
            f"run {run_id!r} in {store.url}: generation {candidate - 1} is the last a launch "
            f"can take (names have 10 digits; a newer one would never be listed, and no "
            f"launch would be fenced); not starting. A number this high is not one launches "
            f"count to: remove {run_id}/{DIRECTORY}/ once no other launch of the run is alive")


def process_record() -> dict[str, Any]:
    """Who holds a generation: enough for ``burst schedule`` to find and stop the process
    on this machine, and nothing secret (no command line, no environment)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def process_start(pid: int | None = None) -> str | None:
    """A token that tells a process from a later one reusing its pid: the boot id and the
    start time in clock ticks (Linux); None where this cannot be read, and then nobody
    signals the process on the strength of a pid alone."""
    pid = os.getpid() if pid is None else pid
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}:{fields[19]}"
    except (OSError, IndexError):
        return None


def same_process(record: Mapping[str, Any]) -> bool:
    """Whether the process a generation record names still runs on this machine."""
    pid, started = record.get("pid"), record.get("started")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or not started:
        return False
    return process_start(pid) == started


# -- the fence -------------------------------------------------------------------------------


def check(store: Store, run_id: str, manifest: bytes | Mapping[str, Any], *,
          publishing: bool, policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Raise :class:`FencedError` if ``manifest`` may not be committed into ``store`` now
    (the rules are in the module doc). ``publishing``: a commit into a store others read
    (first writer wins); otherwise only this process's own launches are fenced, so a
    ``pull`` of older history into a tier is never refused. One ``LIST``; the manifest is
    parsed only when the run has generations at all."""
    taken = generations(store, run_id, policy)
    if not taken:
        return  # a run older than fencing, or one no launch of which writes here
    top = taken[-1]
    parsed = manifest if isinstance(manifest, Mapping) else _parse(manifest)
    generation = generation_of(parsed)
    if generation is None or generation >= top:
        return
    own = _registered(store, run_id)
    mine = own.get(generation)
    if mine is not None and parsed.get(TOKEN) in (None, mine.token):
        mine.fenced_by = top
        raise FencedError(run_id, generation, top, own=True)
    if not publishing:
        return
    if not _this_stores(store, run_id, generation, parsed.get(TOKEN), policy):
        return  # stamped by another store's lineage (a local store the schedule uploads)
    pusher = max(own, default=None)
    if pusher is not None and pusher < top:
        own[pusher].fenced_by = top
        raise FencedError(run_id, pusher, top, own=True)
    if pusher is None or any(generation < k < pusher for k in taken):
        raise FencedError(run_id, generation, top, own=False)


def refusal(store: Store, run_id: str, manifest: bytes | Mapping[str, Any], own: Lineage, *,
            taken: list[int] | None = None, policy: RetryPolicy = DEFAULT_RETRY) -> str | None:
    """Why launch ``own`` must not restore ``manifest`` from its local tier; None when the
    fence accepts it.

    The rule is the catch-up upload's (:func:`check`): a snapshot of generation *g* is
    the run's history for launch *h* when no other launch took a generation between
    them (*g* < *k* < *h*), as after a restart on the same machine. A snapshot of a
    launch that a burst replaced since is refused: its writer was fenced, and its newer
    step must not win over the history the newer launch wrote. (A snapshot the store
    holds was let in by the fence at its commit: the caller asks the store first.)
    ``taken``: the run's generations, if the caller listed them already."""
    parsed = manifest if isinstance(manifest, Mapping) else _parse(manifest)
    generation = generation_of(parsed)
    if generation is None or generation >= own.generation:
        return None  # older than fencing, this launch's own, or a newer launch's
    if not _this_stores(store, run_id, generation, parsed.get(TOKEN), policy):
        return None  # another store's lineage: not judged here
    taken = generations(store, run_id, policy) if taken is None else taken
    between = [k for k in taken if generation < k < own.generation]
    if not between:
        return None
    return (f"taken by generation {generation}, which generation {between[-1]} replaced "
            "since: its writer was fenced and the store refused it")


def stamp_of(manifest: bytes | Mapping[str, Any]) -> tuple[int | None, object]:
    """The (generation, token) a manifest was stamped with: two copies of one snapshot
    (the local tier's and the store's) carry the same."""
    parsed = manifest if isinstance(manifest, Mapping) else _parse(manifest)
    return generation_of(parsed), parsed.get(TOKEN)


def _this_stores(store: Store, run_id: str, generation: int, token: object,
                 policy: RetryPolicy) -> bool:
    """Whether ``generation`` of the manifest is the generation of that number in ``store``
    (numbers count per store). A record is never rewritten, so its token is read once per
    process."""
    if not isinstance(token, str):
        return True  # no token to tell: judge by the number
    cache_key = (store.url, run_id, generation)
    with _LOCK:
        known = _TOKENS.get(cache_key)
    if known is None:
        try:
            record = json.loads(retry(lambda: store.get(key(run_id, generation)), policy))
        except (KeyError, ValueError, UnicodeDecodeError):
            return False
        known = record.get("token") if isinstance(record, dict) else None
        if not isinstance(known, str):
            return False
        with _LOCK:
            _TOKENS[cache_key] = known
    return known == token


def _parse(manifest: bytes) -> Mapping[str, Any]:
    try:
        parsed = json.loads(manifest)
    except (ValueError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


# -- the launches of this process ------------------------------------------------------------
# A push (the upload queue, the scheduler's backup) commits without knowing which launch it
# pushes for; the launches this process holds are found here, by store and run.

_LOCK = threading.Lock()
_LIVE: dict[tuple[str, str], weakref.WeakValueDictionary[int, Lineage]] = {}
_TOKENS: dict[tuple[str, str, int], str] = {}  # (store, run, generation) -> record token


def _register(lineage: Lineage) -> None:
    with _LOCK:
        live = _LIVE.setdefault((lineage.store.url, lineage.run_id),
                                weakref.WeakValueDictionary())
        live[lineage.generation] = lineage


def _registered(store: Store, run_id: str) -> dict[int, Lineage]:
    with _LOCK:
        live = _LIVE.get((store.url, run_id))
        return dict(live.items()) if live is not None else {}


"""Moving a wheelhouse to and from the store.

Wheels are stored content-addressed at ``wheels/<sha256>/<file>``, shared by every run of
the store, so a wheel is uploaded once per store, ever; the lockfile's index goes last.
:func:`ensure` is what freeze and push call: it builds and uploads only when the store
lacks a complete wheelhouse for the target (or a resumed node's lockfile can reuse the
index of one that pins the same distributions). :func:`download` is the node's side.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst.env import lockfile
from burst.env.lockfile import Lockfile
from burst.env.wheelhouse.assemble import build
from burst.env.wheelhouse.house import (
    BURST_DIST,
    Say,
    Wheelhouse,
    WheelhouseError,
    sha256_of,
    wheel_key,
)
from burst.env.wheelhouse.index import INDEX_FILE, dumps, index_key, load_index
from burst.env.wheelhouse.target import Target
from burst.errors import BurstError
from burst.store.base import Pace, Store
from burst.store.files import upload_files
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retrying


@dataclass
class Uploaded:
    """What one upload sent: a wheel already in the store is never sent again."""

    wheels_sent: int = 0
    bytes_sent: int = 0
    wheels_present: int = 0
    index_key: str = ""
    index: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False  # upload's ``stop`` was set: wheels are missing, no index written


def upload(store: Store, run_id: str, digest: str, house: Wheelhouse, *,
           pace: Pace | None = None, stop: threading.Event | None = None,
           policy: RetryPolicy = DEFAULT_RETRY) -> Uploaded:
    """Store every wheel not yet in the store, then the lockfile's index (last: a reader
    that finds the index finds every wheel it names).

    The wheels go up several at once, each from its file on disk (multipart and parallel
    on S3/OSS: :func:`burst.store.files.upload_files`), resumably: a wheel already in the
    store is skipped, and an S3 upload a failed or killed push left open is continued.
    For the background stager (burst.staging.parts): pass its throttle's ``wait`` as
    ``pace`` and its stop event as ``stop``; a stopped upload writes no index and says
    ``stopped``, and the next call sends only what is still missing. Each store call is
    retried on a transient fault through ``policy``."""
    store = retrying(store, policy)
    done = Uploaded(index_key=index_key(run_id, digest), index=house.index())
    files = []
    for wheel in house.wheels:
        if wheel.path is None:
            if store.size(wheel.key) is None:
                raise WheelhouseError(f"wheel {wheel.file} is not on this machine")
            done.wheels_present += 1
            continue
        files.append((wheel.key, wheel.path))
    sent = upload_files(store, files, pace=pace, stop=stop, policy=policy)
    done.wheels_sent, done.bytes_sent = sent.sent, sent.bytes_sent
    done.wheels_present += sent.present
    done.stopped = sent.stopped
    if not done.stopped:
        store.put(done.index_key, dumps(done.index))
    return done


def ensure(store: Store, run_id: str, lock: Lockfile, target: Target, *,
           cache: Path | None = None, torch_index: str | None = None,
           say: Say | None = None, paths: list[str] | None = None) -> Uploaded | None:
    """Build and upload the wheelhouse of ``lock`` unless the store already has one for
    this target; None when there was nothing to do. Its reads and writes are retried on
    a transient fault: one cut-short body must not fail a push whose snapshots landed."""
    if target.policy == "none":
        return None
    store = retrying(store)
    existing = load_index(store, run_id, lock.digest)
    if existing is not None and existing.get("target") == target.to_json() and all(
            store.size(wheel_key(w["sha256"], w["file"])) is not None
            for w in existing.get("wheels", [])):
        return None  # an index copied without its wheels (a pushed local tier) is rebuilt
    reused = _reuse(store, run_id, lock, target)
    if reused is not None:  # the same pins under another lockfile (a resumed node's)
        store.put(index_key(run_id, lock.digest), dumps(reused))
        return Uploaded(wheels_present=len(reused["wheels"]),
                        index_key=index_key(run_id, lock.digest), index=reused)
    house = build(lock, target, cache=cache, torch_index=torch_index, say=say, paths=paths)
    return upload(store, run_id, lock.digest, house)


def _reuse(store: Store, run_id: str, lock: Lockfile, target: Target) -> dict[str, Any] | None:
    """The index of another lockfile of this run that pins exactly the same distributions,
    for the same Python, machine and policy, with every wheel in the store.

    A resumed run freezes its node's environment again: its lockfile differs (another patch
    release of Python, another host) but its pins do not, and the node must not rebuild,
    repack or upload what the store has. The index keeps its torch build: the one chosen
    for the run where it was frozen, not the node's default guess."""
    if any(not p.installable and p.name != BURST_DIST for p in lock.packages):
        return None  # local code may have changed under the same version: build it again
    pins = sorted((p.name, p.version) for p in lock.packages)
    same = {k: v for k, v in target.to_json().items() if k != "torch_variant"}
    prefix = f"{run_id}/env/wheelhouse-"
    for key in reversed(store.list(prefix)):
        digest = key[len(prefix):-len(".json")]
        if digest == lock.digest:
            continue
        try:
            index = load_index(store, run_id, digest)
            other = lockfile.load(store, run_id, digest)
        except (BurstError, KeyError):
            continue
        if index is None or sorted((p.name, p.version) for p in other.packages) != pins:
            continue
        if {k: v for k, v in index.get("target", {}).items() if k != "torch_variant"} != same:
            continue
        if all(store.size(wheel_key(w["sha256"], w["file"])) is not None
               for w in index.get("wheels", [])):
            return index
    return None


def download(store: Store, run_id: str, digest: str, dest: Path) -> dict[str, Any]:
    """Fetch the wheelhouse of a run's lockfile into ``dest`` (hash-checked; a wheel
    already there is kept) and write its index beside them; return the index."""
    store = retrying(store)
    index = load_index(store, run_id, digest)
    if index is None:
        raise WheelhouseError(f"run {run_id!r} has no wheelhouse for lockfile {digest[:12]} "
                              f"in {store.url}: run `burst push {run_id}` (or `burst freeze`) "
                              f"where it trains")
    dest.mkdir(parents=True, exist_ok=True)
    for entry in index.get("wheels", []):
        file, sha = _safe_name(entry["file"]), entry["sha256"]
        path = dest / file
        if path.exists() and sha256_of(path) == sha:
            continue
        data = store.get(wheel_key(sha, file))
        if hashlib.sha256(data).hexdigest() != sha:
            raise WheelhouseError(f"wheel {file} in {store.url} does not match its hash")
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    (dest / INDEX_FILE).write_bytes(dumps(index))
    return index


def _safe_name(file: str) -> str:
    if "/" in file or "\\" in file or file.startswith(".") or not file.endswith(".whl"):
        raise WheelhouseError(f"refusing wheel file name {file!r}")
    return file

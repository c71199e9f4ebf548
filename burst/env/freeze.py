"""Freezing a run: its lockfile and its code archive into the run's ``env/`` and ``code/``.

``burst freeze`` calls :func:`freeze`; a :class:`burst.Run` starts :func:`prefetch` at
``attach`` and asks :func:`freeze_run` with a bounded ``wait`` at each snapshot, so every
snapshot manifest can name the environment and code it was taken with. For a training run
this is a side job that must never stop training: any failure becomes a warning and a
``freeze-failed`` event, and the manifest records ``None``. A freeze still running when the
wait runs out (a hung ``git``, a huge tree) is recorded as pending in that manifest: the
snapshot goes ahead, and later ones name the record once it exists (a resume without one
in its manifest takes the run's newest frozen lockfile and code, see :func:`load_frozen`).
The capture runs ``git`` in a background thread while DataLoader workers may ``fork``:
:mod:`burst.staging.spawn` makes that safe (no pipe a forked worker could inherit).

The work is done once per process for a run (and the lockfile once per process at all),
so later snapshots pay a dictionary lookup. Only the local work (metadata, git, tar) runs
before the hashes are known; the uploads go on in a background thread, drained at exit.
Set ``BURST_FREEZE=0`` to switch the automatic freeze off, ``BURST_FREEZE=env`` to freeze
the environment without the code.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst import events
from burst.env import codearchive, lockfile, wheelchoice, wheelhouse
from burst.errors import BurstError
from burst.inputs import part as inputs_part
from burst.redact import scrub_text
from burst.snapshot import priority, reader
from burst.store import is_local
from burst.store.base import Store
from burst.store.retry import retrying

FREEZE_ENV = "BURST_FREEZE"


class FreezeWarning(UserWarning):
    """The environment or code of a run could not be frozen; training goes on."""


@dataclass
class FreezeResult:
    """What a snapshot manifest records about the environment and the code."""

    lockfile_hash: str | None
    code_ref: dict[str, Any] | None
    lockfile_new: bool = False
    code_new: bool = False
    problems: list[str] = field(default_factory=list)
    wheelhouse: wheelhouse.Uploaded | None = None  # None: not built (off, or already there)
    pending: bool = False  # the freeze had not finished when the snapshot was taken


def freeze(store: Store, run_id: str, *, code_dir: Path | str | None = None,
           code: bool = True, max_code_bytes: int | None = None,
           lock: lockfile.Lockfile | None = None,
           wheels: wheelhouse.Target | None = None,
           say: wheelhouse.Say | None = None) -> FreezeResult:
    """Freeze now and store it; raise ``BurstError`` on a problem a user must fix.
    ``wheels``: also store the lockfile's wheelhouse for that node (:mod:`wheelhouse`)."""
    root = Path(code_dir).resolve() if code_dir else default_code_dir()
    lock = lock or lockfile.build(root)
    known = store.size(lockfile.key(run_id, lock.digest)) is not None
    digest = lockfile.save(store, run_id, lock)
    result = FreezeResult(digest, None, lockfile_new=not known)
    if code:
        captured = codearchive.capture(root, max_bytes=max_code_bytes,
                                       exclude=_store_roots(store))
        result.code_ref, result.code_new = codearchive.upload(store, run_id, captured)
    if wheels is not None:
        result.wheelhouse = wheelhouse.ensure(store, run_id, lock, wheels, say=say)
    options: dict[str, Any] = {"say": say} if say else {}  # else the part's own default
    declared = inputs_part.InputsPart(run_id, record=False, code_dir=root, **options)
    declared.stage(store)  # [inputs] paths and $BURST_INPUTS: a training run records more
    events.record(store, run_id, "freeze", lockfile_hash=digest,
                  code_archive=(result.code_ref or {}).get("archive"),
                  code_skipped=(result.code_ref or {}).get("skipped", []))
    return result


def default_code_dir() -> Path:
    """The project a training script belongs to: the current directory, unless the script
    being run lives outside it (``python /path/to/proj/train.py`` from elsewhere)."""
    cwd = Path.cwd().resolve()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main:
        script_dir = Path(main).resolve().parent
        installed = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
        if installed & {script_dir, *script_dir.parents}:
            return cwd  # an installed tool's entry point (pytest, a launcher), not the project
        if cwd not in (script_dir, *script_dir.parents):
            return script_dir
    return cwd


def _store_roots(*stores: Store | None) -> list[Path]:
    """A store or local tier on local disk may sit inside the project (``./.burst``,
    ``./runs``): never archive it (other stores are found by their layout)."""
    roots = [getattr(store, "root", None) for store in stores]
    return [Path(root) for root in roots if isinstance(root, str | os.PathLike)]


# -- the automatic freeze of a Run -------------------------------------------------------

_CACHE: dict[tuple[str, str], FreezeResult] = {}
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_GUARD = threading.Lock()
_LOCKFILE: list[lockfile.Lockfile] = []
_UPLOADS: list[threading.Thread] = []
_EXIT_WAIT: list[int] = []  # the registering pid, once wait_uploads is registered with atexit
_DONE: dict[tuple[str, str], threading.Event] = {}  # set once _CACHE holds the run
_GAVE_UP: set[tuple[str, str]] = set()  # runs whose bounded wait has run out once
_STAGED: set[tuple[str, str]] = set()  # runs whose wheelhouse a stager uploads, throttled
EXIT_WAIT_SECONDS = 120.0
SNAPSHOT_WAIT_SECONDS = 30.0  # what a run's first snapshot waits for its freeze, at most


def freeze_run(store: Store, run_id: str, *, local: Store | None = None,
               wait: float | None = None) -> FreezeResult:
    """The run's frozen environment and code, frozen on the first call; never raises.

    ``wait=None``: freeze here if no one has, and block until done. Thread-safe: a call
    while another is freezing waits for it, so the work is done once. ``wait=seconds``
    (a snapshot): never block longer; the freeze runs in :func:`prefetch`'s thread, and
    if it has not finished in time the result is ``pending`` (no lockfile, no code).
    After one such timeout later calls do not wait at all until the freeze is done.
    ``local``: the run's local tier, kept out of the code archive like the store.
    The uploads run in a daemon thread after the hashes are known; a failed upload is a
    warning and a ``freeze-failed`` event, like a failed freeze.
    """
    if wait is not None:
        return _bounded(store, run_id, local, wait)
    cache_key = (store.url, run_id)
    with _GUARD:
        if cache_key in _CACHE:
            return _CACHE[cache_key]
        lock = _LOCKS.setdefault(cache_key, threading.Lock())
    with lock:
        if cache_key not in _CACHE:
            result = _freeze_quietly(store, run_id, local)
            with _GUARD:
                _CACHE[cache_key] = result
                _DONE.setdefault(cache_key, threading.Event()).set()
        return _CACHE[cache_key]


def prefetch(store: Store, run_id: str, *, local: Store | None = None) -> None:
    """Start :func:`freeze_run` in a daemon thread (once), so no snapshot waits long."""
    if _mode() != "off":
        _start(store, run_id, local)


def _start(store: Store, run_id: str, local: Store | None) -> threading.Event:
    """The event set when the run's freeze is done; starts the freeze thread if none has."""
    cache_key = (store.url, run_id)
    with _GUARD:
        done = _DONE.get(cache_key)
        if done is not None:
            return done
        done = _DONE[cache_key] = threading.Event()
        if cache_key in _CACHE:
            done.set()
            return done
    _wait_at_exit()  # a run that ends while its freeze computes still leaves the lockfile
    # at idle priority: the training step keeps its cores (burst.snapshot.priority)
    priority.start_idle(lambda: freeze_run(store, run_id, local=local), name="burst-freeze")
    return done


def _bounded(store: Store, run_id: str, local: Store | None, wait: float) -> FreezeResult:
    if _mode() == "off":
        return FreezeResult(None, None)
    cache_key = (store.url, run_id)
    done = _start(store, run_id, local)
    with _GUARD:
        patience = 0.0 if cache_key in _GAVE_UP else max(wait, 0.0)
    if not done.wait(patience):
        with _GUARD:
            _GAVE_UP.add(cache_key)
        return FreezeResult(None, None, pending=True)
    return _CACHE.get(cache_key) or FreezeResult(None, None, pending=True)  # reset meanwhile


def frozen_lockfile(store: Store, run_id: str, local: Store | None = None
                    ) -> lockfile.Lockfile:
    """The lockfile this process froze the run with (waiting for the freeze; built here
    when the freeze is off or failed): what the run's wheelhouse is made from."""
    freeze_run(store, run_id, local=local)
    with _GUARD:
        if not _LOCKFILE:
            _LOCKFILE.append(lockfile.build(default_code_dir()))
        return _LOCKFILE[0]


def leave_wheelhouse_to_stager(store: Store, run_id: str) -> None:
    """The run's background stager (:mod:`burst.env.stager`) uploads its wheelhouse,
    throttled behind the snapshots: the freeze must not send it at full speed too."""
    with _GUARD:
        _STAGED.add((store.url, run_id))


def _mode() -> str:
    value = os.environ.get(FREEZE_ENV, "1").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    return "env" if value in ("env", "lockfile") else "all"


def _freeze_quietly(store: Store, run_id: str, local: Store | None = None) -> FreezeResult:
    """Compute here (local work: metadata, git, tar), upload in the background: the
    training thread waits for the hashes its manifest names, never for a slow store."""
    mode = _mode()
    if mode == "off":
        return FreezeResult(None, None)
    try:
        if not _LOCKFILE:
            _LOCKFILE.append(lockfile.build(default_code_dir()))
        lock = _LOCKFILE[0]
    except Exception as error:
        return _failed(store, run_id, "environment", error, FreezeResult(None, None))
    result = FreezeResult(lock.digest, None)
    captured = None
    if mode == "all":
        try:
            captured = codearchive.capture(default_code_dir(), exclude=_store_roots(store, local))
            result.code_ref = captured.ref()
        except Exception as error:
            _failed(store, run_id, "code", error, result)
    thread = threading.Thread(target=_upload_quietly, name="burst-freeze-upload", daemon=True,
                              args=(store, run_id, lock, captured, result))
    _wait_at_exit()
    thread.start()
    with _GUARD:
        _UPLOADS.append(thread)
    return result


def _wait_at_exit() -> None:
    """Register the bounded wait for the freeze at exit, once, when the first freeze or
    upload starts: importing this module (``burst env``, any CLI command) must not arm a
    120 s wait."""
    with _GUARD:
        if not _EXIT_WAIT:
            atexit.register(wait_uploads, EXIT_WAIT_SECONDS)
            _EXIT_WAIT.append(os.getpid())


def wait_uploads(timeout: float | None = None) -> bool:
    """Block until every freeze this process started has computed and stored its lockfile
    and code; False if ``timeout`` ran out. Runs at interpreter exit too (bounded), so a
    short run still leaves its lockfile; the failure guard calls it before ``os._exit``
    (which skips exit handlers), so a run that fails early is still resumable."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _GUARD:
        if _EXIT_WAIT and _EXIT_WAIT[0] != os.getpid():
            return True  # a forked child: the freeze threads are its parent's
        computing = list(_DONE.values())
    for done in computing:
        if not done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            return False
    with _GUARD:
        pending = list(_UPLOADS)
    for thread in pending:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    with _GUARD:
        _UPLOADS[:] = [t for t in _UPLOADS if t.is_alive()]
        return not _UPLOADS


def _upload_quietly(store: Store, run_id: str, lock: lockfile.Lockfile,
                    captured: codearchive.Captured | None, result: FreezeResult) -> None:
    try:
        lockfile.save(store, run_id, lock)
    except Exception as error:
        _failed(store, run_id, "environment", error, result)
    if captured is not None:
        try:
            _, result.code_new = codearchive.upload(store, run_id, captured)
        except Exception as error:
            _failed(store, run_id, "code", error, result)
    problem = inputs_part.stage_quietly(store, run_id, captured.root if captured else None,
                                        captured.tar_gz if captured else None)
    if problem:
        _failed(store, run_id, "inputs", BurstError(problem), result)
    _wheelhouse_quietly(store, run_id, lock, result)
    # no success event: every manifest names the freeze; only failures are news


def _wheelhouse_quietly(store: Store, run_id: str, lock: lockfile.Lockfile,
                        result: FreezeResult) -> None:
    """The run's wheels, for a remote store only: a local one is the local tier, and
    ``burst push`` builds the wheelhouse where it pushes (``$BURST_WHEELS=none``: never)."""
    try:
        if is_local(store):
            return
        choice = wheelchoice.in_effect(store, run_id)  # burst push --wheels no-torch holds
        if (choice.policy or "all") == "none":
            return
        with _GUARD:
            if (store.url, run_id) in _STAGED:
                return
        result.wheelhouse = wheelhouse.ensure(store, run_id, lock,
                                              wheelchoice.target(choice, lock, "all"))
    except Exception as error:
        _failed(store, run_id, "wheelhouse", error, result)


def _failed(store: Store, run_id: str, what: str, error: Exception,
            result: FreezeResult) -> FreezeResult:
    detail = str(error) if isinstance(error, BurstError) else f"{type(error).__name__}: {error}"
    message = scrub_text(f"burst could not freeze the run's {what}: {detail}")
    result.problems.append(message)
    warnings.warn(message + " (training continues; `burst freeze` retries by hand)",
                  FreezeWarning, stacklevel=3)
    events.record(store, run_id, "freeze-failed", say=lambda _message: None, what=what,
                  error=message)
    return result


def reset_cache() -> None:
    """Forget every frozen run (tests; a long-lived process that changed its code)."""
    with _GUARD:
        _CACHE.clear()
        _LOCKS.clear()
        _LOCKFILE.clear()
        _DONE.clear()
        _GAVE_UP.clear()
        _STAGED.clear()


# -- reading a frozen run back -----------------------------------------------------------

def load_frozen(store: Store, run_id: str, step: int | None = None
                ) -> tuple[lockfile.Lockfile, dict[str, Any] | None]:
    """The lockfile and code reference a run resumes with: those its snapshot (default: the
    newest) names, else the newest frozen ones. Read through the retry policy: a
    cut-short body must not fail the push or resume that asked."""
    store = retrying(store)
    manifest = reader.read_manifest(store, run_id, step)
    digest = (manifest or {}).get("lockfile_hash")
    code_ref = (manifest or {}).get("code_ref")
    if isinstance(digest, str) and store.size(lockfile.key(run_id, digest)) is None:
        digest = None  # its upload did not finish (the run died first): the newest one
    lock = lockfile.load(store, run_id, digest if isinstance(digest, str) else None)
    if not isinstance(code_ref, dict):
        code_ref = codearchive.latest_ref(store, run_id)
    return lock, code_ref

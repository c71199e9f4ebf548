"""A store that fails while the training does not: one line and an exit code, no traceback.

The store is where snapshots go to survive the machine, but it is not the training: an
S3 outage as a run starts means nothing was trained yet (stop at once, with
``Exit.STORE_UNREACHABLE``, and say that starting again later loses nothing); an upload
that fails at ``close()`` comes after the training finished and its final snapshot was
written to the local tier (stop with ``Exit.UPLOAD_FAILED``, and say where the snapshot
is and that ``burst push`` uploads it). A traceback in either case would read as a
crashed training and invite rerunning it.

Each also leaves a failure record (``burst.training.failure``): under torchrun the exit
code becomes 1, and the other ranks may be stopped by a signal, so without it the agent
would read an error or a signal stop, not the store's ending it handles on its own.
Only rank 0 reaches the store at the start (and tells the other ranks how it went) and
only rank 0 uploads (``burst.training.run``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from burst import events
from burst.contract import Exit
from burst.errors import StoreError
from burst.parallel.group import Group
from burst.snapshot import reader
from burst.store import Store
from burst.training import failure

T = TypeVar("T")
WRITER = 0  # the rank that reaches the store at the start and uploads: rank 0


def at_start(store: Store, run_id: str, first: Callable[[], T], group: Group) -> T | None:
    """``first()`` on rank 0, the run's first call to its store (None on the others); a
    store error there ends every rank in one line with ``Exit.STORE_UNREACHABLE``.

    On several ranks rank 0 tells the others how it went (one broadcast): had it just
    left, they would die in their next collective with gloo's or NCCL's own traceback."""
    result: T | None = None
    error: str | None = None
    if group.is_writer:
        try:
            result = first()
        except StoreError as exc:
            error = " ".join(str(exc).split()) or type(exc).__name__
    error = group.broadcast_json(error)
    if error is None:
        return result
    _say(f"run {run_id!r} cannot start: {error}; nothing was trained, start it again "
         f"once {store.url} answers")
    failure.write_record(failure.STORE_UNREACHABLE, Exit.STORE_UNREACHABLE, step=None,
                         rank=group.rank, detail=error)
    raise SystemExit(Exit.STORE_UNREACHABLE) from None


def kept_locally(local: Store, run_id: str, step: int) -> bool:
    """Whether the local tier holds the snapshot of ``step``: only then is a failed upload
    not a lost snapshot."""
    try:
        return step in reader.list_steps(local, run_id)
    except Exception:
        return False


def upload_failed(local: Store, store: Store, run_id: str, step: int,
                  error: BaseException) -> NoReturn:
    """Training finished, its snapshot is in ``local``, the upload failed: say so, record
    it in the local history, and end the process with ``Exit.UPLOAD_FAILED``."""
    where = str(getattr(local, "root", local.url))
    why = " ".join(str(error).split()) or type(error).__name__
    events.record(local, run_id, failure.UPLOAD_FAILED, step=step, message=why,
                  say=lambda _: None)
    failure.write_record(failure.UPLOAD_FAILED, Exit.UPLOAD_FAILED, step=step, rank=WRITER,
                         detail=why)
    _say(f"training finished at step {step}; snapshots kept locally at {where}; upload "
         f"failed: {why}; `burst push {run_id} --store {store.url} --local {where}` uploads "
         f"them later; exit {Exit.UPLOAD_FAILED}")
    raise SystemExit(Exit.UPLOAD_FAILED)


def _say(line: str) -> None:
    print(f"burst: {line}", file=sys.stderr, flush=True)

"""How one attempt of the training command ended, from its ranks' failure records first
and its exit status only where no rank left one.

The exit status alone lies under a launcher: torchrun turns a worker's 86 (OOM) into 1,
so the agent would see a script error and SkyPilot's ``recover_on_exit_codes`` would never
match. Each rank that leaves through burst's guard writes a record
(``burst.training.failure.write_record``) into a directory the supervisor creates fresh for
the attempt; after the child exits the supervisor reads them here. A SIGKILL or a segfault
leaves no record, and then the exit status is all there is.

With several ranks the records can disagree: one rank runs out of memory, and the launcher
then stops the others with SIGTERM, so they record a signal stop. The decisive record is
the one whose kind says most about the machine: a GPU failure (no CUDA call on that card
can be trusted) outranks an OOM (the card works, the batch is too big), which outranks a
signal stop (everything works). The store's endings (92 and 93, rank 0's: it alone reaches
the store at the start and uploads) sit just above a signal stop, which torchrun then
gives the other ranks. Among equals the lowest rank decides.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst.contract import Reason
from burst.training import failure

# higher decides: what a failure says about the machine, not which rank came first; a
# fenced rank (a newer launch owns the run) outranks all: nothing may be retried here. The
# store's endings (burst.training.outage: a 92 every rank records, a 93 rank 0's) outrank
# the signal stops torchrun sends the other ranks: the agent acts on the store's ending
PRIORITY = {Reason.FENCED: 5, Reason.GPU_FAILURE: 4, Reason.OOM: 3,
            failure.UPLOAD_FAILED: 2, failure.STORE_UNREACHABLE: 2, Reason.SIGNAL: 1}
KIND_CODES = {kind: code for code, kind in failure.EXIT_KINDS.items()}


@dataclass(frozen=True)
class Verdict:
    """One attempt's ending: the kind the policies act on, burst's exit code for it (what
    the supervisor exits with), and which rank's record said so (None: the exit status)."""

    kind: str  # ok, oom, gpu-failure, signal, store-unreachable, upload-failed, killed, error
    code: int  # burst's own code (86, 87, 88...) when a record decided, else the status
    returncode: int  # the child's raw exit status (torchrun's 1 under several ranks)
    rank: int | None = None
    records: tuple[dict[str, Any], ...] = field(default=())

    @property
    def source(self) -> str:
        return "exit-status" if self.rank is None else "record"

    def describe(self) -> str:
        """One line for a person: the status, and the record that overrode it if any."""
        status = failure.describe_exit(self.returncode)
        if self.rank is None:
            return f"{status} ({self.kind})"
        ranks = f" of {len(self.records)} record(s)" if len(self.records) > 1 else ""
        return (f"{status}; rank {self.rank} recorded {self.kind} "
                f"(exit {self.code}){ranks} ({self.kind})")


def decisive(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The record that decides the attempt (see the module docstring), or None."""
    known = [r for r in records if r.get("kind") in PRIORITY]
    if not known:
        return None
    return min(known, key=lambda r: (-PRIORITY[r["kind"]], r["rank"]))


def judge(returncode: int, records: Sequence[dict[str, Any]]) -> Verdict:
    """The verdict for a child that exited with ``returncode`` leaving ``records``.

    A clean exit is a success whatever was recorded; otherwise a record decides, and the
    exit status only speaks for an attempt that left none."""
    if returncode == 0:
        return Verdict("ok", 0, 0, records=tuple(records))
    chosen = decisive(records)
    if chosen is None:
        return Verdict(failure.classify_exit(returncode), returncode, returncode,
                       records=tuple(records))
    kind = chosen["kind"]
    code = chosen.get("exit_code")
    if not isinstance(code, int) or code <= 0:
        code = KIND_CODES[kind]
    return Verdict(kind, code, returncode, int(chosen["rank"]), tuple(records))


def read(directory: str | Path) -> list[dict[str, Any]]:
    """The records an attempt left in ``directory`` (none if it is gone)."""
    return failure.read_records(directory) if Path(directory).is_dir() else []


@contextlib.contextmanager
def record_directory() -> Iterator[Path]:
    """A fresh, empty directory for one attempt's records, removed afterwards: records of
    an earlier attempt must never decide a later one."""
    path = Path(tempfile.mkdtemp(prefix="burst-failures-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

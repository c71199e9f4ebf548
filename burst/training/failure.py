"""How a training process fails, and the exit codes that tell the agent what happened.

Three kinds of failure are worth telling apart because each leaves a different part of
the state trustworthy:

- ``oom``: CUDA ran out of memory. The device still works; what the step allocated can
  be freed and the step-consistent state read back from it (or, if the optimizer step
  was running, from the RAM shadow).
- ``gpu-failure``: a sticky CUDA error (illegal address, launch failure, ECC, Xid). No
  CUDA call can be trusted again, so only the host-RAM shadow is usable.
- ``signal``: SIGTERM/SIGINT (preemption, Ctrl-C). Everything works; stop at the next
  step boundary with a fresh snapshot.

Anything else is a bug in the training script: burst keeps the snapshots it has and lets
the error through unchanged.

Exit codes alone do not survive every launcher (torchrun turns a worker's 86 into 1), so
each rank that leaves through the guard also writes a *failure record*,
``$BURST_FAILURE_DIR/rank-<rank>.json``, which the supervisor reads after the child exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from burst.contract import ENV_FAILURE_DIR, Exit, Reason

# the store failed, not the training (burst.training.outage): at the start (nothing trained),
# or the final upload (the snapshot is in the local tier): the agent acts on each apart
STORE_UNREACHABLE = "store-unreachable"
UPLOAD_FAILED = "upload-failed"

# what each exit code says about how the process ended (classify_exit)
EXIT_KINDS: dict[int, str] = {Exit.OOM: Reason.OOM, Exit.GPU_FAILURE: Reason.GPU_FAILURE,
              Exit.STOPPED: Reason.SIGNAL, Exit.FENCED: Reason.FENCED,
              Exit.SETUP_FAILED: "setup-failed",
              Exit.STORE_UNREACHABLE: STORE_UNREACHABLE, Exit.UPLOAD_FAILED: UPLOAD_FAILED}

STICKY_PATTERNS = (
    "illegal memory access",
    "illegal address",
    "unspecified launch failure",
    "misaligned address",
    "uncorrectable ecc error",
    "device-side assert",
    "an illegal instruction was encountered",
    "cuda error: unknown error",
    "gpu has fallen off the bus",
    "cudaerrorlaunchfailure",
    "cublas_status_execution_failed",
    "nvml_error_gpu_is_lost",
)


def classify(exc: BaseException) -> Reason | None:
    """``"oom"``, ``"gpu-failure"`` or None (an ordinary error) for an exception.

    torch is looked up, not imported: an exception raised by torch means torch is loaded,
    and supervisors that only read exit codes and records never pay for importing it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return Reason.OOM
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        if "out of memory" in message and "cuda" in message:
            return Reason.OOM
        if any(pattern in message for pattern in STICKY_PATTERNS):
            return Reason.GPU_FAILURE
    return None


def classify_exit(returncode: int) -> str:
    """What a child's exit status says: ok, oom, gpu-failure, signal, store-unreachable,
    upload-failed, killed or error."""
    if returncode == 0:
        return "ok"
    if returncode in EXIT_KINDS:
        return EXIT_KINDS[returncode]
    if returncode < 0:
        return "killed"  # SIGKILL, SIGSEGV...: no chance to snapshot
    return "error"


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


# -- failure records ---------------------------------------------------------------------

RECORD_FIELDS = ("kind", "exit_code", "step", "rank", "pid", "time", "detail")


def write_record(kind: str, exit_code: int, *, step: int | None, rank: int,
                 detail: str = "") -> Path | None:
    """Leave ``rank-<rank>.json`` in ``$BURST_FAILURE_DIR`` saying how this rank is leaving.

    Written on the way out of a failing process, so it never raises (a record that cannot
    be written must not replace the failure's own exit code with a traceback) and is
    atomic (a temporary file renamed into place: a reader never sees half a record).
    Returns the record's path, or None when the variable is unset or the write failed.
    """
    directory = os.environ.get(ENV_FAILURE_DIR)  # the supervisor's, fresh per attempt
    if not directory:
        return None
    record = {"kind": kind, "exit_code": exit_code, "step": step, "rank": rank,
              "pid": os.getpid(),
              "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
              "detail": detail}
    target = Path(directory) / f"rank-{rank}.json"
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".rank-{rank}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        return target
    except Exception:  # see the docstring: never raise on the way out
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return None


def read_records(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The failure records in ``directory``, sorted by rank. A file that cannot be read or
    is not a record (a rank killed mid-write leaves no such file, but a person might) is
    skipped: the supervisor falls back on the exit status for that rank."""
    records = []
    for path in sorted(Path(directory).glob("rank-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int) \
                and isinstance(record.get("kind"), str):
            records.append({field: record.get(field) for field in RECORD_FIELDS})
    return sorted(records, key=lambda record: record["rank"])

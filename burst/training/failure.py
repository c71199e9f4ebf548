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
"""

from __future__ import annotations

import signal

import torch

EXIT_OOM = 86
EXIT_GPU_FAILURE = 87
EXIT_STOPPED = 88  # stopped on SIGTERM/SIGINT after a snapshot at a step boundary

EXIT_KINDS = {EXIT_OOM: "oom", EXIT_GPU_FAILURE: "gpu-failure", EXIT_STOPPED: "signal"}

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


def classify(exc: BaseException) -> str | None:
    """``"oom"``, ``"gpu-failure"`` or None (an ordinary error) for an exception."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom"
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        if "out of memory" in message and "cuda" in message:
            return "oom"
        if any(pattern in message for pattern in STICKY_PATTERNS):
            return "gpu-failure"
    return None


def classify_exit(returncode: int) -> str:
    """What a child's exit status says: ok, oom, gpu-failure, signal, killed or error."""
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

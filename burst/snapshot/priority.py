"""Background work at the lowest CPU and I/O priority the kernel grants.

A persist (hashing, writing, committing a snapshot) runs beside the training step. On a
host whose cores the step keeps busy (a CPU run, or a GPU run's dataloader workers) it
took those cores from the step: measured, the training time it cost was larger than the
persist's own time. A thread at ``SCHED_IDLE`` with nice 19 and idle I/O class runs only
on what the step leaves over, so the step no longer pays for it; the snapshot becomes
durable a little later, which the interval policy (:mod:`burst.training.adaptive`)
accounts for.

On Linux scheduling attributes are per thread and a new thread inherits its creator's,
so lowering the persister thread lowers the hashing and writing pools it starts too.
Each part is best effort: a kernel, container or platform that refuses one keeps the
others, and :func:`lower_this_thread` says which were obtained (the run records it).

The price: an idle thread runs only when a core is free of every other process too. On a
host shared with other busy work (a loaded CI machine, a login node) a snapshot can wait
long to become durable; ``BURST_BACKGROUND_PRIORITY=normal`` keeps the persister (and the
run's other background preparation, :func:`start_idle`) at the process's own priority.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

ENV_PRIORITY = "BURST_BACKGROUND_PRIORITY"  # "normal": background threads keep the process's
NORMAL = "normal"
NICE = 19  # the lowest CPU priority a nice value gives
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread alone
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "s390x": 282}


def lower_this_thread() -> str:
    """Lower the calling thread to idle CPU scheduling, nice 19 and idle I/O, as far as
    permitted; return what was obtained, e.g. ``"sched_idle,nice19,ioprio_idle"``
    (``"normal"`` where nothing was, or ``$BURST_BACKGROUND_PRIORITY`` is ``normal``)."""
    if os.environ.get(ENV_PRIORITY, "").strip().lower() == NORMAL:
        return NORMAL
    tid = threading.get_native_id()
    got = [name for name, lower in (("sched_idle", _sched_idle), ("nice19", _nice),
                                    ("ioprio_idle", _ioprio_idle)) if lower(tid)]
    return ",".join(got) or NORMAL


def start_idle(target: Callable[[], object], *, name: str) -> threading.Thread:
    """Start a daemon thread running ``target`` at idle priority: a run's background
    preparation (the freeze and code archive, staging, recording inputs) takes its first
    seconds' spare cycles, not the training step's (what a subprocess it starts inherits)."""
    def lowered() -> None:
        lower_this_thread()
        target()

    thread = threading.Thread(target=lowered, name=name, daemon=True)
    thread.start()
    return thread


def _sched_idle(tid: int) -> bool:
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        setter(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return False
    return True


def _nice(tid: int) -> bool:
    """Nice 19 for this thread (Linux: ``setpriority`` on a thread id is per thread)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, tid, NICE)
    except OSError:
        return False
    return True


def _ioprio_idle(tid: int) -> bool:
    """The idle I/O class (``ioprio_set``; glibc has no wrapper, so the raw syscall)."""
    number = _SYS_IOPRIO_SET.get(os.uname().machine) if sys.platform.startswith("linux") \
        else None
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT
        return libc.syscall(number, _IOPRIO_WHO_PROCESS, tid, value) == 0
    except (OSError, AttributeError):
        return False

"""What a run does while its process is failing: OOM, a dead GPU, a signal.

The guard is installed by ``Run.attach``. It owns the process-wide hooks (SIGTERM and
SIGINT handlers, ``sys.excepthook``) and turns each failure into the same four moves:
save the freshest state that is still trustworthy, wait for the store (the snapshot, and
the run's environment freeze if it is still running: a failure early in a run must not
leave a snapshot that ``burst resume`` refuses for want of a lockfile), leave a failure
record, and exit with a code that says what happened (``burst.training.failure``) so the
supervisor can pick a policy.

The guard sees a run only through ``GuardedRun``, the few things it must ask of one
(``burst.training.rescue`` provides them), so it depends on neither the run nor its parts.

Recovery runs outside any ``except`` block: a CUDA OOM's traceback holds the frames,
and with them the tensors, of the step that failed; clearing those frames first is what
lets the emergency snapshot find memory to work with.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any, NoReturn, Protocol

import torch

from burst.contract import Exit, Reason
from burst.env import freeze
from burst.state.capture import Components
from burst.training import failure

DEFAULT_GRACE_SECONDS = 30.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GuardedRun(Protocol):
    """What the guard needs from a run (a run's ``Rescue`` provides it): where it stands,
    and the three ways to keep state that a failure leaves trustworthy."""

    rank: int
    step: int  # optimizer steps completed
    micro_batch: int
    components: Components

    @property
    def in_optimizer_step(self) -> bool:
        """True while ``optimizer.step()`` runs (the live state is then half-updated)."""
        ...

    def layout(self) -> dict[str, int]:
        """The batch layout (global, micro, accumulation, world_size), for failure events."""
        ...

    def save_boundary(self, reason: str) -> int | None:
        """Snapshot the live state as it was at the last step boundary; return its step."""
        ...

    def persist_shadow(self, reason: str) -> int | None:
        """Queue the newest RAM copy without touching the device; return its step."""
        ...

    def record_event(self, name: str, /, **fields: Any) -> None:
        """Add an event to the run's history."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued snapshot is stored; raise if one failed."""
        ...


class Guard:
    """Signal and exception handling for one run in this process."""

    def __init__(self, run: GuardedRun, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
        self.run = run
        self.grace_seconds = grace_seconds
        self.stop_requested: str | None = None
        self.snapshot_requested: str | None = None  # by a watcher thread (preemption notice)
        self._request_lock = threading.Lock()
        self._previous_handlers: dict[int, object] = {}
        self._previous_excepthook = sys.excepthook
        self._handling = False
        self._signalled_at: float | None = None  # monotonic time of the first signal

    # -- installation -------------------------------------------------------------------

    @property
    def installed(self) -> bool:
        """Whether :meth:`install` is in force (installing twice would make the guard its
        own "previous" handler, which :meth:`uninstall` could then never remove)."""
        return bool(self._previous_handlers) or sys.excepthook == self._excepthook

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        self._previous_excepthook = sys.excepthook  # as it is now, not as the run was made
        sys.excepthook = self._excepthook

    def uninstall(self) -> None:
        for signum, handler in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)  # type: ignore[arg-type]  # None (set outside Python): refused, suppressed
        self._previous_handlers.clear()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook

    # -- signals ------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested:
            _say(f"second {name}: exiting now")
            self._leave_record(Reason.SIGNAL, 128 + signum, self.run.step,
                               f"second {name}: exited at once, without a new snapshot")
            os._exit(128 + signum)
        self.stop_requested = name
        self._signalled_at = time.monotonic()
        _say(f"{name}: snapshot at the next step boundary, then exit "
             f"(within {self.grace_seconds:.0f}s; send it again to exit at once)")
        threading.Thread(target=self._watchdog, name="burst-grace", daemon=True).start()

    def _watchdog(self) -> None:
        """If no step boundary comes within the grace period, keep the RAM shadow and go."""
        time.sleep(self.grace_seconds * 0.8)
        _say("no step boundary within the grace period: saving the newest RAM copy")
        saved = self._persist_shadow(Reason.SIGNAL, budget=self.grace_seconds * 0.2)
        self._store_environment(self._grace_left())
        self._leave_record(Reason.SIGNAL, Exit.STOPPED, self.run.step,
                           f"{self.stop_requested}: no step boundary within the grace "
                           f"period; {_kept(saved)}")
        os._exit(Exit.STOPPED)

    # -- requests from other threads (a preemption notice) ---------------------------------

    def request_snapshot(self, reason: str) -> None:
        """From any thread: ask for a snapshot at the next step boundary, stored before the
        loop goes on. Like a signal it only sets a flag, so the asking thread never touches
        training state and the loop pays nothing until it is set."""
        with self._request_lock:
            self.snapshot_requested = reason

    def take_snapshot_request(self) -> str | None:
        """At a step boundary: the pending request's reason (cleared), or None."""
        if self.snapshot_requested is None:  # the common case, without the lock
            return None
        with self._request_lock:
            reason, self.snapshot_requested = self.snapshot_requested, None
        return reason

    def store_requested(self) -> None:
        """After the requested snapshot is queued: wait until it is stored (within the
        grace period), report a failure and let training go on either way."""
        self._flush(self.grace_seconds)

    def stop_at_boundary(self) -> NoReturn:
        """Called by the run at a step boundary after a signal, once the snapshot of that
        boundary is queued: record, flush, exit."""
        reason = self.stop_requested or Reason.SIGNAL
        step = self.run.step
        self.run.record_event("failure", kind=Reason.SIGNAL, signal=reason, step=step,
                              action="snapshot at step boundary")
        self._flush(self.grace_seconds)  # the snapshot and the event above
        self._store_environment(self._grace_left())
        self._leave_record(Reason.SIGNAL, Exit.STOPPED, step,
                           f"{reason}: stopped at the boundary of step {step} with a snapshot")
        _say(f"stopped after step {step}; snapshot saved")
        raise SystemExit(Exit.STOPPED)

    # -- exceptions ---------------------------------------------------------------------

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException,
                    tb: TracebackType | None) -> None:
        if failure.classify(exc) is None or self._handling:
            self._previous_excepthook(exc_type, exc, tb)
            return
        try:
            code = self.recover(exc)
        except BaseException as error:  # never let recovery itself end in a traceback
            _say(f"emergency handling failed: {error}")
            kind = failure.classify(exc) or Reason.GPU_FAILURE
            code = Exit.OOM if kind == Reason.OOM else Exit.GPU_FAILURE
            self._leave_record(kind, code, self.run.step + 1,
                               f"{_first_line(exc)}; emergency handling failed: {error}")
        # os._exit skips exit handlers, the freeze's wait among them: wait here, as long
        # as a normal exit would (no one's grace period is running out)
        self._store_environment(freeze.EXIT_WAIT_SECONDS)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def recover(self, exc: BaseException) -> int:
        """Save what can be trusted after ``exc``; return the exit code to leave with."""
        self._handling = True
        kind = failure.classify(exc)
        summary = _first_line(exc)
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # drop the failed step's tensors
        if kind == Reason.OOM:
            return self._recover_oom(summary)
        return self._recover_gpu_failure(summary)

    def _recover_oom(self, summary: str) -> int:
        run = self.run
        in_optimizer = run.in_optimizer_step
        _free_memory(run)
        if in_optimizer:
            source = "RAM shadow (the optimizer step was interrupted)"
            saved = run.persist_shadow(Reason.OOM)
        else:
            saved = run.save_boundary(Reason.OOM)
            # several ranks, or no boundary marked (CUDA unused): the RAM shadow
            source = ("live state at the last step boundary" if saved == run.step
                      else "RAM shadow")
        run.record_event("failure", kind=Reason.OOM, step=run.step + 1,
                         in_optimizer_step=in_optimizer, snapshot_step=saved, error=summary,
                         **run.layout())
        self._flush(None)
        outcome = f"snapshot of step {saved} from the {source}" if saved is not None else \
            _kept(saved)
        self._leave_record(Reason.OOM, Exit.OOM, run.step + 1,
                           f"{summary}; micro-batch {run.micro_batch}; {outcome}")
        _say(f"CUDA out of memory in step {run.step + 1} (micro-batch {run.micro_batch}); "
             f"{outcome}; exit {Exit.OOM}")
        return Exit.OOM

    def _recover_gpu_failure(self, summary: str) -> int:
        run = self.run
        saved = run.persist_shadow(Reason.GPU_FAILURE)
        run.record_event("failure", kind=Reason.GPU_FAILURE, step=run.step + 1,
                         snapshot_step=saved, error=summary, **run.layout())
        self._flush(None)
        kept = _kept(saved)
        self._leave_record(Reason.GPU_FAILURE, Exit.GPU_FAILURE, run.step + 1,
                           f"{summary}; {kept}")
        _say(f"GPU failure in step {run.step + 1} ({summary}); {kept}; "
             f"exit {Exit.GPU_FAILURE}")
        return Exit.GPU_FAILURE

    def _persist_shadow(self, reason: str, budget: float | None) -> int | None:
        step = self.run.persist_shadow(reason)
        self._flush(budget)
        return step

    def _store_environment(self, budget: float) -> None:
        """Let a freeze still computing or uploading store the run's lockfile and code
        before the process goes: without them ``burst resume`` refuses the snapshot."""
        try:
            stored = freeze.wait_uploads(max(budget, 0.0))
        except Exception as exc:  # never let the wait itself end the exit in a traceback
            _say(f"the run's environment could not be stored: {exc}")
            return
        if not stored:
            _say("the run's environment (lockfile and code) was still being frozen at exit; "
                 "run `burst freeze` from the project before `burst resume`")

    def _grace_left(self) -> float:
        if self._signalled_at is None:
            return self.grace_seconds
        return self.grace_seconds - (time.monotonic() - self._signalled_at)

    def _leave_record(self, kind: str, exit_code: int, step: int, detail: str) -> None:
        """The failure record the supervisor reads (the exit code may not reach it intact)."""
        failure.write_record(kind, exit_code, step=step, rank=self.run.rank, detail=detail)

    def _flush(self, timeout: float | None) -> None:
        try:
            self.run.flush(timeout)
        except Exception as exc:  # report, but still exit with the failure's own code
            _say(f"the emergency snapshot could not be stored: {exc}")


def _kept(saved: int | None) -> str:
    return (f"RAM copy of step {saved} saved without touching CUDA" if saved is not None
            else "no RAM copy yet, so the newest persisted snapshot stands")


def _free_memory(run: GuardedRun) -> None:
    optimizer = run.components.optimizer
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _say(message: str) -> None:
    print(f"burst: {message}", file=sys.stderr, flush=True)

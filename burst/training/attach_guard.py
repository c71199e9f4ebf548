"""A refused ``Run.attach`` leaves the process as it found it.

``attach`` installs process-wide things before it can know whether the run may resume:
the failure guard (SIGTERM/SIGINT handlers, ``sys.excepthook``), the preemption watcher's
thread, a module-buffer hook in torch, step hooks on the caller's optimizer. It cannot
check first: choosing the snapshot may pull it for minutes, and a preemption notice or a
SIGTERM in that time must already be handled. So each step that installs something
pushes its undo here, and a refusal (a ``ConfigError``, a bad or foreign snapshot, a
fenced launch, any exception or ``SystemExit`` out of ``attach``) runs them newest first.
A caller that fixes its mistake and attaches again then starts from a clean process, and
a test (or a notebook) that catches the refusal is not left with burst's handlers.

What cannot be undone is not started before the checks pass: the environment freeze and
the pre-staging threads upload to the store, so they start only once the run attached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType

from burst.training import preemption

STOP_SECONDS = 5.0  # a watcher between polls stops at once; a long poll is a daemon thread


class Rollback:
    """Undo actions of one ``attach``, run newest first if it ends in an exception."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []

    def push(self, undo: Callable[[], object]) -> None:
        self._undo.append(undo)

    def __enter__(self) -> Rollback:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        undo, self._undo = self._undo, []
        if exc_type is None:
            return
        for action in reversed(undo):
            with contextlib.suppress(Exception):  # the refusal is what the caller must see
                action()


def stop_watcher(watcher: preemption.Watcher) -> None:
    """End a preemption watcher this attach started, waiting a little for its thread."""
    watcher.stop()
    watcher.join(STOP_SECONDS)

"""Run a short helper program (``git``) safely from a process that may ``fork`` meanwhile.

``subprocess`` is not safe in a thread of a training process: while it starts a child it
holds pipes (its internal exec-error pipe, and the output pipes of ``capture_output``),
and a DataLoader worker ``fork``-ed from another thread at that moment inherits their
write ends. The parent then waits for an end of file that only comes when the worker
exits, so ``timeout=`` never applies and the run hangs for good.

:func:`run` holds no pipe at all. The child is started with ``posix_spawn`` (glibc's
``clone(CLONE_VFORK)``: exec errors come back through shared memory, not a pipe), and
its stdin, stdout and stderr are opened *by the child* from paths in a private temporary
directory. The parent only polls ``waitpid``, so a fork at any moment inherits nothing
it waits on, and the timeout always applies: the child is killed when it runs out.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_POLL_FIRST, _POLL_MAX = 0.001, 0.05  # seconds between waitpid polls, growing


@dataclass(frozen=True)
class Done:
    """How a helper program ended: its exit status (negative: killed by that signal,
    ``None``: timed out or reaped elsewhere) and what it wrote."""

    returncode: int | None
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Done:
    """Run ``argv`` (looked up on ``$PATH``) to completion or ``timeout`` seconds.

    Raises ``OSError`` when the program cannot be started (not installed), like
    ``subprocess`` does; a timeout kills the child and returns ``returncode=None``."""
    scratch = Path(tempfile.mkdtemp(prefix="burst-spawn-"))
    try:
        out, err = scratch / "out", scratch / "err"
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(out), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, str(err), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        ]
        environ = dict(os.environ if env is None else env)
        pid = os.posix_spawnp(argv[0], list(argv), environ, file_actions=actions,
                              setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGPIPE))
        returncode = _wait(pid, timeout)
        return Done(returncode, _read(out), _read(err))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wait(pid: int, timeout: float) -> int | None:
    """Poll for the child's exit; kill it once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    pause = _POLL_FIRST
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None  # reaped by someone else: its status is lost
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            _kill(pid)
            return None
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""

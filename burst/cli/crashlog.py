"""Where a bug's traceback goes: a private log file, not the user's terminal.

An expected failure is one ``Error:`` line. A bug (any other exception) still deserves a
short message, but its traceback is what a maintainer needs, so it is written to
``$BURST_LOG_DIR`` or ``$XDG_STATE_HOME/burst/logs/`` (``~/.local/state/burst/logs/``),
owner-only, with every URL in it stripped of credentials, and the message names the file.
"""

from __future__ import annotations

import os
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

from burst.redact import scrub_text

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

LOG_DIR_ENV = "BURST_LOG_DIR"
MAX_SAME_SECOND = 1000  # crash logs one process may write within one second


def log_dir() -> Path:
    explicit = os.environ.get(LOG_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "burst" / "logs"


def write(error: BaseException, argv: list[str] | None = None) -> Path | None:
    """Write ``error``'s traceback to a new log file; its path, or None if none could be."""
    from burst import __version__

    now = datetime.now(UTC)
    lines = [f"burst {__version__}, python {sys.version.split()[0]}, {now.isoformat()}",
             "command: " + " ".join(argv if argv is not None else sys.argv), "",
             *traceback.format_exception(error)]
    try:
        directory = log_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path, fd = _create(directory, f"crash-{now.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        with os.fdopen(fd, "w") as f:
            f.write(scrub_text("\n".join(line.rstrip("\n") for line in lines)) + "\n")
    except OSError:
        return None
    return path


def _create(directory: Path, stem: str) -> tuple[Path, int]:
    """A new owner-only file ``<stem>.log``, else ``<stem>-2.log``, ``-3``...: two crashes
    in the same second of one process each keep their traceback. Never opens an existing
    file or follows a link planted at the name (O_EXCL, O_NOFOLLOW): the next name is tried."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for number in range(1, MAX_SAME_SECOND + 1):
        path = directory / (f"{stem}.log" if number == 1 else f"{stem}-{number}.log")
        try:
            return path, os.open(path, flags, 0o600)
        except FileExistsError:
            continue
    raise FileExistsError(f"{MAX_SAME_SECOND} crash logs named {stem} already exist")

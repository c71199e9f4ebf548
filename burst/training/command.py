"""The command line of a run started without the agent, for ``burst resume`` to run again.

``burst run -- python train.py`` records its child's command (the agent's ``child-start``
event), but a run started as plain ``python train.py`` had nothing to say what the node
should run, so ``burst resume`` asked for it after ``--``. The run records its own command
line instead, in its ``start`` and ``resume`` events: the interpreter's ``sys.orig_argv``
(options such as ``-u`` or ``-m module`` included) behind ``sys.executable``. The
interpreter's path means nothing on the node; ``burst resume`` turns it into the node's
interpreter and the paths under the code archive into the archive's
(``burst.resume.entrypoint``).

Nothing is recorded where re-running the command line would not re-run the training: an
interactive interpreter, ``python -c``, a script read from standard input, a notebook's
kernel; nor under the agent, whose record of its child is the one to trust.
"""

from __future__ import annotations

import os
import shlex
import sys

from burst.contract import ENV_FAILURE_DIR

FIELD = "command"  # in the run's start and resume events


def fields() -> dict[str, str]:
    """``{"command": ...}`` for a start or resume event, or nothing (see above)."""
    command = started_command()
    return {FIELD: command} if command else {}


def started_command() -> str | None:
    """This process's command line, shell-quoted, when re-running it re-runs the run."""
    if os.environ.get(ENV_FAILURE_DIR):  # under the agent: its child-start names it
        return None
    main = sys.modules.get("__main__")
    if main is None or not getattr(main, "__file__", None) or sys.flags.interactive \
            or "ipykernel" in sys.modules:
        return None
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if not argv or argv[1:2] == ["-"]:
        return None
    return shlex.join([sys.executable or argv[0], *argv[1:]])

"""The rich console every command prints through: whole tables and lines off a terminal.

rich fits its output to the terminal, and without one (CI logs, ``| tee``, a file) it
assumes 80 columns: tables are squeezed until their values are cut (``micro-ba…``), and a
long message wraps where a word ends, so ``burst: run R finished at`` and the place it
finished at land on two lines. Off a terminal there is no width to fit, so the console is
as wide as what it prints and never wraps a line; on a terminal (or with ``$COLUMNS``
set) rich decides as usual. rich loads only when a command prints through it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# wider than any table burst prints: a table then takes its natural width, every value whole
UNBOUNDED = 100_000


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that cuts and wraps nothing unless a terminal is
    there to fit."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=UNBOUNDED, soft_wrap=True)


def human_age(seconds: float | None) -> str:
    """How long ago, as a person reads it in a table: ``12m 05s``, ``3h 07m``, ``?``."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"

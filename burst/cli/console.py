"""The rich console every command prints through: whole tables and lines off a terminal.

rich fits its output to the terminal, and without one (CI logs, ``| tee``, a file) it
assumes 80 columns: tables are squeezed until their values are cut (``micro-ba…``), and a
long message wraps where a word ends, so ``burst: run R finished at`` and the place it
finished at land on two lines. Off a terminal there is no width to fit, so the console is
as wide as what it prints and never wraps a line; on a terminal (or with ``$COLUMNS``
set) rich decides as usual. rich loads only when a command prints through it.

Whatever a store says (a manifest's reason, an event's message, a key a listing returned)
is anyone's to write, and a terminal acts on the control characters in what it prints: an
OSC 52 sequence writes the clipboard, CSI 2J clears the screen, a carriage return or a
bidi override makes a line read as something else. So every store-derived string goes
through :func:`shown` (plain lines) or :func:`cell` (rich tables, markup escaped too)
before it is printed; ``--json`` output needs neither (``json.dumps`` escapes them).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# wider than any table burst prints: a table then takes its natural width, every value whole
UNBOUNDED = 100_000

# C0 controls (newline and tab included: one value stays on its line), DEL, C1 controls
# (0x9b alone starts a CSI on many terminals) and Unicode's bidi overrides and isolates
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPED = {code: ascii(chr(code))[1:-1] for code in _CONTROLS}


def shown(value: object) -> str:
    """``value`` as text a terminal only displays: each control character appears as its
    escape (``\\x1b``, ``\\n``, ``\\u202e``), never acted on."""
    return str(value).translate(_ESCAPED)


def cell(value: object) -> str:
    """:func:`shown`, with rich's markup escaped too: a value for a rich table or title."""
    from rich.markup import escape

    return escape(shown(value))


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

"""A rich progress bar for transfers, on stderr so ``--json`` output stays clean.

rich.progress is the slowest import of a transfer command: it loads only when a bar will
actually be drawn (enabled, and stderr is a terminal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@contextlib.contextmanager
def transfer_bar(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(bytes_done, snapshot_total)`` callback drawing one bar."""
    console = _terminal() if enabled else None
    if console is None:
        yield lambda _n, _total: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, total=total, advance=n)

        yield advance


def _terminal() -> Console | None:
    """A rich console on stderr if stderr is a terminal (as rich decides: FORCE_TERMINAL...)."""
    from rich.console import Console

    console = Console(stderr=True)
    return console if console.is_terminal else None

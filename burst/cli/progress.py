"""A rich progress bar for transfers, on stderr so ``--json`` output stays clean."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@contextlib.contextmanager
def transfer_bar(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(bytes_done, snapshot_total)`` callback drawing one bar."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda _n, _total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, total=total, advance=n)

        yield advance

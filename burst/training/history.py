"""A run's events as one rank records them (``burst.events`` keeps the lines).

Rank 0 tells the run's story (its start, resume and finish); every rank adds what went
wrong on it, marked with its rank, so a failure on rank 3 is in the history too. The
history is worth less than the run, so recording only warns when the store refuses.
"""

from __future__ import annotations

from typing import Any

from burst import events
from burst.store import Store

_STORY = ("start", "resume", "finish")  # rank 0's alone


class History:
    """Records one rank's events into the run's history in its local tier (uploaded with
    the snapshots)."""

    def __init__(self, local: Store, run_id: str, rank: int, writer: bool) -> None:
        self.local, self.run_id = local, run_id
        self._rank, self._writer = rank, writer

    def __call__(self, name: str, /, **fields: Any) -> None:
        """Record an event; the history is worth less than the run, so failures only warn."""
        if not self._writer:
            if name in _STORY:
                return
            fields.setdefault("rank", self._rank)
        events.record(self.local, self.run_id, name, **fields)

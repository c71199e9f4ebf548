"""The run's membership changes as the agent's exporter sees them: the
``membership-change`` events its training processes recorded (burst.training.membership),
followed as the history grows.

The agent's history is a local directory (the store itself when local, else the local
tier its child writes to), where ``events.jsonl`` only ever grows by whole appends, so a
scrape reads only the bytes added since the last one, never the whole history again: a
run of days has megabytes of GPU samples and metrics there.
"""

from __future__ import annotations

import json
import threading

from burst import events
from burst.contract import MEMBERSHIP_EVENT, MembershipChange
from burst.store.base import Store


class MembershipFeed:
    """Every membership change recorded in ``store``'s history of ``run_id`` so far."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.key = store, events.key(run_id)
        self._offset = 0  # bytes of the history already read
        self._partial = b""  # a line still being written
        self._changes: list[MembershipChange] = []
        self._lock = threading.Lock()  # scrapes may overlap

    def changes(self) -> list[MembershipChange]:
        with self._lock:
            self._read_new()
            return list(self._changes)

    def _read_new(self) -> None:
        size = self.store.size(self.key)
        if size is None or size < self._offset:  # none yet, or replaced: start over
            self._offset, self._partial, self._changes = 0, b"", []
            if size is None:
                return
        if size == self._offset:
            return
        data = self._partial + bytes(self.store.read_range(self.key, self._offset,
                                                           size - self._offset))
        self._offset = size
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            change = _change(line)
            if change is not None:
                self._changes.append(change)


def _change(line: bytes) -> MembershipChange | None:
    """The change a history line records, if it is one (any other line, or a damaged one,
    is not)."""
    if MEMBERSHIP_EVENT.encode() not in line:
        return None
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or event.get("event") != MEMBERSHIP_EVENT:
        return None
    return MembershipChange.from_event(event)

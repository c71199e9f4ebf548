"""The goodput table: one row per change of a run's membership, the same in the HTML page
and in ``burst report``'s terminal output."""

from __future__ import annotations

from collections.abc import Iterable

from burst.contract import MembershipChange

MEMBERSHIP_COLUMNS = ("step", "state from", "world", "steps lost", "seconds to train",
                      "cause")


def membership_rows(changes: Iterable[MembershipChange]) -> list[list[str]]:
    """Each change as strings; what the history does not know shows as ``?``."""
    return [[str(c.step), str(c.state_from), f"{_known(c.world_before)} -> {c.world_after}",
             _known(c.steps_lost), _known(c.seconds_to_step), _known(c.cause)]
            for c in changes]


def _known(value: object) -> str:
    return "?" if value is None else str(value)

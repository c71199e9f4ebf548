"""Times and durations as people type them: ISO 8601 instants with a zone, ``30m``, ``2h``.

A deadline without a zone is ambiguous (a Beijing user's 18:00 is 10:00 UTC), and a
scheduler that guesses wrong bursts hours early or late, so a zone is required. Durations
are plain numbers with a unit, combinable (``1h30m``); a bare number is refused rather
than guessed as seconds or minutes.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from burst.errors import ConfigError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_WHOLE = re.compile(r"(?:\s*\d+(?:\.\d+)?\s*[smhdw])+\s*")


def parse_duration(text: str, *, what: str = "duration") -> timedelta:
    """``30m``, ``2h``, ``1d``, ``1h30m``, ``45s`` → a positive timedelta."""
    cleaned = text.strip().lower()
    if not cleaned or not _WHOLE.fullmatch(cleaned):
        raise ConfigError(f"{what} {text!r} is not a duration: write a number and a unit "
                          "(s, m, h, d, w), e.g. 30m, 2h, 1d, 1h30m")
    seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(cleaned))
    if seconds <= 0:
        raise ConfigError(f"{what} must be longer than zero, got {text!r}")
    return timedelta(seconds=seconds)


def parse_instant(text: str, *, what: str = "time") -> datetime:
    """An ISO 8601 instant with a zone (``2026-12-03T18:00+08:00``, ``...Z``) → aware datetime."""
    cleaned = text.strip()
    try:
        # Python 3.10's fromisoformat does not read a trailing Z
        value = datetime.fromisoformat(cleaned[:-1] + "+00:00" if cleaned[-1:] in "zZ"
                                       and cleaned else cleaned)
    except ValueError:
        raise ConfigError(f"{what} {text!r} is not an ISO 8601 time: write e.g. "
                          "2026-12-03T18:00+08:00") from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(f"{what} {text!r} has no time zone: add one, e.g. "
                          f"{cleaned}+08:00 or {cleaned}Z")
    return value


def parse_deadline(text: str, now: datetime) -> datetime:
    """A deadline: an instant with a zone that is still ahead of ``now``."""
    deadline = parse_instant(text, what="deadline")
    if deadline <= now:
        ago = human(now - deadline)
        raise ConfigError(f"deadline {text} is in the past ({ago} ago): give a future time")
    return deadline


def human(span: timedelta | float) -> str:
    """A short duration for people: ``2d3h``, ``1h30m``, ``45s``, ``-20m`` (overdue)."""
    seconds = span.total_seconds() if isinstance(span, timedelta) else float(span)
    if seconds < 0:
        return "-" + human(-seconds)
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])  # two units are precise enough for people: 2d3h, 7m30s


def iso(moment: datetime) -> str:
    """An instant as ISO 8601 to the second, keeping its zone (what events and output show)."""
    return moment.isoformat(timespec="seconds")

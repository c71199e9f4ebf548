"""Deadlines and cadences as users type them: ISO 8601 with a zone, plain durations."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from burst.deadline.timespec import human, parse_deadline, parse_duration, parse_instant
from burst.errors import ConfigError

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("2h", 7200), ("1d", 86400),
                                               ("1h30m", 5400), ("45s", 45), ("1.5h", 5400)])
def test_plain_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0m", "0s", "0h0m"])
def test_a_zero_duration_is_refused(text):
    with pytest.raises(ConfigError, match="longer than zero"):
        parse_duration(text, what="--every")


@pytest.mark.parametrize("text", ["30", "", "soon", "-5m", "30 minutes"])
def test_a_duration_without_a_unit_is_refused_not_guessed(text):
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)


def test_an_iso_deadline_keeps_its_zone():
    deadline = parse_deadline("2026-12-03T18:00+08:00", NOW)
    assert deadline == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert deadline.utcoffset() == timedelta(hours=8)


def test_z_means_utc():
    assert parse_instant("2026-12-03T18:00Z") == datetime(2026, 12, 3, 18, 0, tzinfo=UTC)


def test_a_deadline_without_a_zone_is_refused():
    with pytest.raises(ConfigError, match="no time zone"):
        parse_deadline("2026-12-03T18:00", NOW)


def test_a_deadline_in_the_past_is_refused():
    with pytest.raises(ConfigError, match="in the past"):
        parse_deadline("2026-11-30T18:00+08:00", NOW)


def test_a_garbled_deadline_is_refused():
    with pytest.raises(ConfigError, match="not an ISO 8601 time"):
        parse_deadline("next friday", NOW)


def test_human_durations_are_short():
    assert human(timedelta(days=2, hours=3, minutes=5)) == "2d3h"
    assert human(5400) == "1h30m" and human(42) == "42s" and human(-1200) == "-20m"
    assert human(450) == "7m30s"

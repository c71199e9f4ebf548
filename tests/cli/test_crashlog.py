"""Crash logs: every crash keeps its own traceback, in an owner-only file burst created."""

from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from burst.cli import crashlog

FROZEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=crashlog.UTC)


class _FrozenClock(datetime):
    """The same second for every crash: the case the log's name must still tell apart."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return FROZEN


@pytest.fixture
def same_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(crashlog.LOG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(crashlog, "datetime", _FrozenClock)
    return tmp_path


def test_two_crashes_in_the_same_second_of_one_process_each_get_their_own_log(
        same_second: Path) -> None:
    first = crashlog.write(RuntimeError("first bug"), ["burst", "ls"])
    second = crashlog.write(RuntimeError("second bug"), ["burst", "ls"])
    assert first is not None and second is not None and first != second
    assert "first bug" in first.read_text() and "second bug" in second.read_text()
    assert "first bug" not in second.read_text()


def test_every_crash_log_of_the_same_second_is_owner_only(same_second: Path) -> None:
    paths = [crashlog.write(RuntimeError(f"bug {n}"), ["burst"]) for n in range(3)]
    assert all(p is not None for p in paths) and len(set(paths)) == 3
    for path in paths:
        assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_link_planted_at_a_crash_logs_name_is_skipped_not_followed(
        same_second: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    stem = f"crash-{FROZEN.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (same_second / f"{stem}.log").symlink_to(victim)
    path = crashlog.write(RuntimeError("a bug"), ["burst"])
    assert path is not None and not path.is_symlink() and "a bug" in path.read_text()
    assert victim.read_text() == "keep me"

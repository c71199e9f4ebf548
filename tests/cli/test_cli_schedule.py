"""``burst schedule`` from the command line: one-line errors, --dry-run, --once, bursting."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.deadline import scheduler as sched
from burst.snapshot import reader
from burst.store import LocalStore
from tests.helpers.schedule_helpers import take

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

FUTURE = "2099-12-03T18:00+08:00"


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    """Locks and logs go to a temporary $XDG_STATE_HOME, not the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def stores(tmp_path):
    """A local tier with run ``r`` (snapshots at steps 10 and 20) and an empty remote."""
    local = LocalStore(tmp_path / "local")
    take(local, 10, run_id="r", total_steps=1000)
    take(local, 20, run_id="r", total_steps=1000)
    return local, LocalStore(tmp_path / "remote")


def flags(stores) -> list[str]:
    local, remote = stores
    return ["--store", remote.url, "--local", local.url]


def invoke(*args: str):
    return CliRunner().invoke(main, ["schedule", *args])


def one_line_error(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "burst.cli", "schedule", *args],
                          capture_output=True, text=True, check=False)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def behind(local: LocalStore, now: datetime) -> None:
    """The last hour at 0.1 steps/s with 980 steps left: hours late for a 2 h deadline."""
    events.append(local, "r", "start", time=(now - timedelta(hours=1)).isoformat())
    for minutes in range(60, -1, -10):
        events.append(local, "r", "snapshot", step=20 - minutes // 10,
                      time=(now - timedelta(minutes=minutes)).isoformat())


def test_a_deadline_in_the_past_is_a_one_line_error(stores):
    code, line = one_line_error("r", "--deadline", "2020-01-01T00:00Z", *flags(stores))
    assert code == 2 and line.startswith("Error: deadline 2020-01-01T00:00Z is in the past")


def test_an_unknown_run_is_a_one_line_error(stores):
    result = invoke("nope", "--deadline", FUTURE, *flags(stores))
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith("Error: unknown run 'nope'")


def test_a_cadence_of_zero_is_a_one_line_error(stores):
    result = invoke("r", "--deadline", FUTURE, "--every", "0m", *flags(stores))
    assert result.exit_code == 2
    assert result.output == "Error: --every must be longer than zero, got '0m'\n"


def test_a_deadline_without_a_zone_is_a_usage_error(stores):
    result = invoke("r", "--deadline", "2099-12-03T18:00", *flags(stores))
    assert result.exit_code == 2 and "has no time zone" in result.output


def test_a_missing_deadline_is_a_usage_error(stores):
    result = invoke("r", *flags(stores))
    assert result.exit_code == 2 and "--deadline is required" in result.output


def test_backing_up_into_the_local_tier_itself_is_refused(stores):
    local, _ = stores
    result = invoke("r", "--deadline", FUTURE, "--store", local.url, "--local", local.url)
    assert result.exit_code == 2 and "is the local tier itself" in result.output


def test_modes_cannot_be_combined(stores):
    result = invoke("r", "--deadline", FUTURE, "--dry-run", "--once", *flags(stores))
    assert result.exit_code == 2 and "cannot be combined" in result.output


def test_a_dry_run_shows_the_timeline_and_the_decision_and_touches_nothing(stores):
    local, remote = stores
    deadline = (datetime.now(UTC) + timedelta(hours=6)).isoformat(timespec="minutes")
    result = invoke("r", "--deadline", deadline, *flags(stores), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "backups planned:" in result.output and "every 30m" in result.output
    assert "every 5m" in result.output and "decision now: wait" in result.output
    assert reader.list_steps(remote, "r") == [] and events.read(local, "r") == []


def test_a_dry_run_as_json_lists_every_backup_and_the_latest_burst_moments(stores):
    local, _ = stores
    now = datetime.now(UTC)
    behind(local, now)
    deadline = (now + timedelta(hours=2)).isoformat(timespec="minutes")
    result = invoke("r", "--deadline", deadline, *flags(stores), "--dry-run", "--json",
                    "--cloud-speedup", "50", "--margin", "20m", "--total-steps", "100")
    data = json.loads(result.output)
    assert data["backups"][0] <= data["backups"][-1] < data["deadline"]
    assert data["decision"]["action"] == "burst-spot"
    assert set(data["burst_by"]) == {"spot", "on_demand"}


def test_once_backs_up_decides_and_records_both(stores):
    local, remote = stores
    result = invoke("r", "--deadline", FUTURE, *flags(stores), "--once")
    assert result.exit_code == 0, result.output
    assert reader.list_steps(remote, "r") == [20]
    names = [e["event"] for e in events.read(local, "r")]
    assert names[-2:] == [sched.BACKUP, sched.DECISION]
    assert [e["event"] for e in events.read(remote, "r")][-2:] == names[-2:]  # flushed
    again = invoke("r", "--deadline", FUTURE, *flags(stores), "--once")
    assert "no backup due yet" in again.output


def test_once_after_the_deadline_does_nothing_and_says_how_to_remove_it(stores):
    result = invoke("r", "--deadline", "2020-01-01T00:00Z", *flags(stores), "--once")
    assert result.exit_code == 0 and "--uninstall" in result.output


def test_once_bursts_with_the_burst_command_when_the_run_is_behind(stores, tmp_path):
    local, _ = stores
    now = datetime.now(UTC)
    behind(local, now)
    deadline = (now + timedelta(hours=2)).isoformat(timespec="minutes")
    marker = tmp_path / "burst.txt"
    result = invoke("r", "--deadline", deadline, *flags(stores), "--once", "--margin", "20m",
                    "--total-steps", "100", "--cloud-speedup", "50",
                    "--burst-command", f"echo {{run}} {{tier}} > {marker}")
    assert result.exit_code == 0, result.output
    assert marker.read_text().split() == ["r", "spot"]
    launching, burst = [e for e in events.read(local, "r") if e["event"] == sched.BURST]
    assert launching["state"] == "launching" and launching["spot"]
    assert burst["ok"] and burst["state"] == "launched" and burst["step"] == 20
    again = invoke("r", "--deadline", deadline, *flags(stores), "--once")
    assert "already burst" in again.output


def test_no_burst_records_the_decision_but_launches_nothing(stores, tmp_path):
    local, _ = stores
    now = datetime.now(UTC)
    behind(local, now)
    deadline = (now + timedelta(hours=2)).isoformat(timespec="minutes")
    result = invoke("r", "--deadline", deadline, *flags(stores), "--once", "--no-burst",
                    "--cloud-speedup", "50", "--margin", "20m", "--total-steps", "100")
    assert result.exit_code == 0
    history = events.read(local, "r")
    assert not [e for e in history if e["event"] == sched.BURST]
    assert [e for e in history if e["event"] == sched.DECISION][-1]["action"] == "burst-spot"


def test_the_default_burst_runs_burst_resume_with_only_the_chosen_tier(monkeypatch):
    from burst.cli import schedule as cli_schedule

    ran = []
    monkeypatch.setattr(cli_schedule.subprocess, "run",
                        lambda args, check: ran.append(args) or subprocess.CompletedProcess(
                            args, 0))
    burster = cli_schedule._burster(None, "skypilot", "oss://b/burst", "/w/.burst")
    assert burster("r", True) == 0 and burster("r", False) == 0
    assert ran[0][3:] == ["resume", "r", "--to", "skypilot", "--store", "oss://b/burst",
                          "--local", "/w/.burst", "--spot"]
    assert ran[1][-1] == "--no-spot"


def test_a_tick_while_another_schedule_holds_the_run_is_skipped(stores, state_home):
    from burst.deadline import timers as install_timer

    _, remote = stores
    with sched.exclusive(state_home / "burst" / f"{install_timer.unit_name('r')}.lock"):
        result = invoke("r", "--deadline", FUTURE, *flags(stores), "--once")
    assert result.exit_code == 0 and "skipping this tick" in result.output
    assert reader.list_steps(remote, "r") == []

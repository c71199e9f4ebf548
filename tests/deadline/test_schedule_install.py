"""``--install`` / ``--uninstall`` round trips against a fake crontab and a temporary systemd
user directory (the system tools are the boundary: fakes on PATH stand in for them)."""

from __future__ import annotations

import stat
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.deadline import timers as install_timer
from burst.store import LocalStore
from tests.helpers.schedule_helpers import take

COMMAND = ["/venv/bin/python", "-m", "burst.cli", "schedule", "run-1", "--once"]
EVERY = timedelta(minutes=5)

FAKE_CRONTAB = """#!/bin/sh
if [ "$1" = "-l" ]; then
  if [ -f "$CRONTAB_FILE" ]; then /bin/cat "$CRONTAB_FILE"; exit 0; fi
  echo "no crontab for tester" >&2; exit 1
fi
if [ "$1" = "-" ]; then /bin/cat > "$CRONTAB_FILE"; exit 0; fi
exit 2
"""
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$SYSTEMCTL_LOG"
"""


def tool(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def cron(tmp_path, monkeypatch) -> Path:
    """A fake ``crontab`` (the only tool on PATH); returns the file it keeps the table in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "crontab", FAKE_CRONTAB)
    table = tmp_path / "crontab.txt"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("CRONTAB_FILE", str(table))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return table


@pytest.fixture
def systemd(tmp_path, monkeypatch) -> Path:
    """A temporary XDG_CONFIG_HOME and a fake ``systemctl``; returns the log of its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "systemctl", FAKE_SYSTEMCTL)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("SYSTEMCTL_LOG", str(tmp_path / "systemctl.log"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "systemctl.log"


def test_a_cron_install_adds_one_marked_line_and_uninstall_removes_only_it(cron):
    cron.write_text("0 3 * * * backup-photos\n")
    done = install_timer.install("cron", "run-1", COMMAND, EVERY, workdir=Path("/work dir"))
    lines = cron.read_text().splitlines()
    assert lines[0] == "0 3 * * * backup-photos" and lines[1] == done.written[0]
    assert lines[1].startswith("*/5 * * * * cd '/work dir' && /venv/bin/python -m burst.cli")
    assert lines[1].endswith("# burst-schedule:run-1")
    (removed,) = install_timer.uninstall("run-1")
    assert removed.written == [lines[1]]
    assert cron.read_text().splitlines() == ["0 3 * * * backup-photos"]


def test_installing_twice_replaces_the_line_instead_of_adding_another(cron):
    install_timer.install("cron", "run-1", COMMAND, EVERY, workdir=Path("/w"))
    install_timer.install("cron", "run-1", COMMAND, timedelta(minutes=10), workdir=Path("/w"))
    lines = cron.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("*/10 ")


def test_another_runs_cron_line_survives_an_uninstall(cron):
    install_timer.install("cron", "run-1", COMMAND, EVERY, workdir=Path("/w"))
    install_timer.install("cron", "run-10", COMMAND, EVERY, workdir=Path("/w"))
    install_timer.uninstall("run-1")
    assert cron.read_text().strip().endswith("# burst-schedule:run-10")


def test_percent_signs_are_escaped_for_cron():
    line = install_timer.cron_line("r", ["echo", "50%"], EVERY, Path("/w"))
    assert "50\\%" in line and "50%" not in line.replace("\\%", "")


def test_cron_fires_hourly_or_slower_for_long_gaps():
    assert install_timer.cron_schedule(timedelta(hours=2)) == "0 */2 * * *"
    assert install_timer.cron_schedule(timedelta(seconds=20)) == "*/1 * * * *"


def test_a_systemd_install_writes_a_timer_and_a_service_and_uninstall_removes_them(systemd,
                                                                                    tmp_path):
    done = install_timer.install("systemd", "run-1", [*COMMAND, "--burst-command", "x $HOME"],
                                 EVERY, workdir=Path("/w"))
    units = tmp_path / "config" / "systemd" / "user"
    service, timer = units / "burst-schedule-run-1.service", units / "burst-schedule-run-1.timer"
    assert sorted(done.written) == sorted([str(service), str(timer)])
    assert "OnUnitActiveSec=300s" in timer.read_text()
    assert 'ExecStart=/venv/bin/python -m burst.cli schedule run-1 --once --burst-command ' \
           '"x $$HOME"' in service.read_text()
    assert systemd.read_text().splitlines() == [
        "--user daemon-reload", "--user enable --now burst-schedule-run-1.timer"]
    (removed,) = install_timer.uninstall("run-1")
    assert not service.exists() and not timer.exists()
    assert "--user disable --now burst-schedule-run-1.timer" in systemd.read_text()
    assert removed.kind == "systemd" and len(removed.written) == 2


def test_without_systemctl_the_units_are_written_and_the_commands_left_to_the_user(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    done = install_timer.install("systemd", "run-1", COMMAND, EVERY, workdir=Path("/w"))
    assert done.activated == [] and done.manual == [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now burst-schedule-run-1.timer"]


def test_uninstalling_nothing_says_so(cron, tmp_path):
    result = CliRunner().invoke(main, ["schedule", "run-1", "--uninstall"])
    assert result.exit_code == 0 and "nothing installed for run-1" in result.output


def test_the_cli_install_prints_the_line_and_how_to_remove_it_then_uninstall_round_trips(
        cron, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    take(_local(tmp_path), 5, run_id="run-1", total_steps=100)
    args = ["schedule", "run-1", "--deadline", "2099-12-03T18:00+08:00", "--store",
            str(tmp_path / "remote"), "--local", str(tmp_path / "local"), "--total-steps",
            "100", "--install"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    line = cron.read_text().strip()
    assert line in result.output and "remove it with: burst schedule run-1 --uninstall" in (
        result.output)
    assert "--once" in line and "--deadline 2099-12-03T18:00:00+08:00" in line
    assert f"--local {(tmp_path / 'local').as_uri()}" in line
    removed = CliRunner().invoke(main, ["schedule", "run-1", "--uninstall"])
    assert removed.exit_code == 0 and f"removed crontab line: {line}" in removed.output
    assert cron.read_text().strip() == ""


def _local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "local")

"""Installing a schedule so it outlives the terminal: a user crontab line or a systemd timer.

Either way the installed job runs ``burst schedule RUN ... --once`` every ``floor`` (the
shortest backup gap); ``--once`` reads the run's events to see whether a backup is due, so
the tightening cadence works with a fixed-rate timer, and the job stops acting after the
deadline or a burst. Each entry carries the run id in a marker (cron) or a unit name
(systemd), which is how ``--uninstall`` finds exactly what was installed and nothing else.

Cron runs commands with a bare environment and splits ``%`` into lines; systemd expands
``%`` specifiers and ``$`` variables. The commands are quoted for each, with absolute
paths, so what runs later is what the user ran now.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from burst.errors import BurstError, ConfigError

KINDS = ("auto", "cron", "systemd")
MARKER = "# burst-schedule:"


@dataclass(frozen=True)
class Installed:
    """What an install or uninstall did, for the user to read and to undo."""

    kind: str
    written: list[str]  # the crontab line, or the unit files' paths
    contents: dict[str, str] = field(default_factory=dict)  # file path -> text written
    activated: list[str] = field(default_factory=list)  # commands run to switch it on
    manual: list[str] = field(default_factory=list)  # commands the user must still run
    remove: str = ""  # how to undo it


def unit_name(run_id: str) -> str:
    """``burst-schedule-<run>``, with characters systemd and cron would choke on replaced."""
    return "burst-schedule-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


def state_dir() -> Path:
    """``$XDG_STATE_HOME/burst`` (default ``~/.local/state/burst``): logs and locks."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "burst"


def log_path(run_id: str) -> Path:
    """Where an installed cron job's output goes: ``$XDG_STATE_HOME/burst/<unit>.log``."""
    return state_dir() / f"{unit_name(run_id)}.log"


def choose(kind: str) -> str:
    """``auto``: cron where a ``crontab`` command exists (it runs without a login session),
    else a systemd user timer."""
    if kind != "auto":
        tool = "crontab" if kind == "cron" else "systemctl"
        if kind == "cron" and not shutil.which(tool):
            raise ConfigError(f"--timer {kind}: no `{tool}` on PATH")
        return kind
    if shutil.which("crontab"):
        return "cron"
    if shutil.which("systemctl"):
        return "systemd"
    raise ConfigError("neither crontab nor systemctl is on PATH: run `burst schedule` in the "
                      "foreground (e.g. under tmux or nohup) instead of --install")


def install(kind: str, run_id: str, command: Sequence[str], every: timedelta, *,
            workdir: Path, description: str = "") -> Installed:
    """Install ``command`` to run every ``every`` for ``run_id`` (replacing an older one)."""
    chosen = choose(kind)
    if chosen == "cron":
        return install_cron(run_id, command, every, workdir=workdir)
    return install_systemd(run_id, command, every, workdir=workdir, description=description)


def uninstall(run_id: str) -> list[Installed]:
    """Remove every cron line and systemd unit installed for ``run_id``."""
    removed = []
    if shutil.which("crontab"):
        cron = uninstall_cron(run_id)
        if cron.written:
            removed.append(cron)
    systemd = uninstall_systemd(run_id)
    if systemd.written:
        removed.append(systemd)
    return removed


# -- cron ------------------------------------------------------------------------------------


def cron_schedule(every: timedelta) -> str:
    """A cron time spec firing about every ``every`` (at least each minute)."""
    minutes = max(int(every.total_seconds() // 60), 1)
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = min(minutes // 60, 23)
    return f"0 */{hours} * * *"


def cron_line(run_id: str, command: Sequence[str], every: timedelta, workdir: Path) -> str:
    log = log_path(run_id)
    shell = (f"cd {shlex.quote(str(workdir))} && {shlex.join(command)} "
             f">> {shlex.quote(str(log))} 2>&1")
    return f"{cron_schedule(every)} {shell.replace('%', chr(92) + '%')} {MARKER}{run_id}"


def install_cron(run_id: str, command: Sequence[str], every: timedelta, *,
                 workdir: Path) -> Installed:
    line = cron_line(run_id, command, every, workdir)
    log_path(run_id).parent.mkdir(parents=True, exist_ok=True)
    kept = [entry for entry in _read_crontab() if not _ours(entry, run_id)]
    _write_crontab([*kept, line])
    return Installed("cron", [line], activated=["crontab -"],
                     remove=f"burst schedule {shlex.quote(run_id)} --uninstall  (or `crontab -e` "
                            f"and delete the line ending in '{MARKER}{run_id}')")


def uninstall_cron(run_id: str) -> Installed:
    lines = _read_crontab()
    ours = [entry for entry in lines if _ours(entry, run_id)]
    if ours:
        _write_crontab([entry for entry in lines if not _ours(entry, run_id)])
    return Installed("cron", ours, activated=["crontab -"] if ours else [])


def _ours(line: str, run_id: str) -> bool:
    return line.rstrip().endswith(f"{MARKER}{run_id}")


def _read_crontab() -> list[str]:
    done = _run(["crontab", "-l"])
    if done.returncode != 0:
        if "no crontab" in done.stderr.lower():
            return []
        raise BurstError(f"`crontab -l` failed: {_last_line(done.stderr)}")
    return done.stdout.splitlines()


def _write_crontab(lines: list[str]) -> None:
    done = _run(["crontab", "-"], "".join(f"{line}\n" for line in lines))
    if done.returncode != 0:
        raise BurstError(f"`crontab -` refused the new table: {_last_line(done.stderr)}")


# -- systemd ---------------------------------------------------------------------------------


def unit_dir() -> Path:
    """``$XDG_CONFIG_HOME/systemd/user`` (default ``~/.config/systemd/user``)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def systemd_units(run_id: str, command: Sequence[str], every: timedelta, workdir: Path,
                  description: str = "") -> dict[str, str]:
    """The ``.service`` and ``.timer`` texts, by file name."""
    name = unit_name(run_id)
    about = description or f"burst schedule for run {run_id}"
    seconds = max(int(every.total_seconds()), 60)
    service = (f"[Unit]\nDescription={about}\n\n[Service]\nType=oneshot\n"
               f"WorkingDirectory={_systemd_quote(str(workdir))}\n"
               f"ExecStart={' '.join(_systemd_quote(arg) for arg in command)}\n")
    timer = (f"[Unit]\nDescription={about} (timer)\n\n[Timer]\nOnActiveSec=0\n"
             f"OnUnitActiveSec={seconds}s\nAccuracySec=30s\nUnit={name}.service\n\n"
             "[Install]\nWantedBy=timers.target\n")
    return {f"{name}.service": service, f"{name}.timer": timer}


def install_systemd(run_id: str, command: Sequence[str], every: timedelta, *, workdir: Path,
                    description: str = "") -> Installed:
    directory = unit_dir()
    directory.mkdir(parents=True, exist_ok=True)
    contents = {}
    for filename, text in systemd_units(run_id, command, every, workdir, description).items():
        (directory / filename).write_text(text)
        contents[str(directory / filename)] = text
    timer = f"{unit_name(run_id)}.timer"
    activated, manual = _systemctl([["daemon-reload"], ["enable", "--now", timer]])
    return Installed("systemd", list(contents), contents, activated, manual,
                     remove=f"burst schedule {shlex.quote(run_id)} --uninstall  (or "
                            f"`systemctl --user disable --now {timer}` and delete "
                            f"{' and '.join(contents)})")


def uninstall_systemd(run_id: str) -> Installed:
    directory, name = unit_dir(), unit_name(run_id)
    files = [directory / f"{name}.timer", directory / f"{name}.service"]
    present = [f for f in files if f.exists()]
    if not present:
        return Installed("systemd", [])
    activated, manual = _systemctl([["disable", "--now", f"{name}.timer"]])
    for path in present:
        path.unlink()
    more, more_manual = _systemctl([["daemon-reload"]])
    return Installed("systemd", [str(p) for p in present], activated=activated + more,
                     manual=manual + more_manual)


def _systemctl(calls: list[list[str]]) -> tuple[list[str], list[str]]:
    """Run ``systemctl --user`` calls; what could not run is returned for the user to run."""
    done: list[str] = []
    manual: list[str] = []
    for args in calls:
        words = ["systemctl", "--user", *args]
        if manual or not shutil.which("systemctl") or _run(words).returncode != 0:
            manual.append(shlex.join(words))
        else:
            done.append(shlex.join(words))
    return done, manual


def _systemd_quote(arg: str) -> str:
    """One ExecStart word: ``%`` and ``$`` escaped, quoted when it holds spaces or quotes."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%$+=:,./-]+", escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- running the system tools ----------------------------------------------------------------


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(args, 127, "", str(error))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"

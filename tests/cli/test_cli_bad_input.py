"""Bad input for every command: a one-line error, a non-zero exit, never a traceback.

The table is generated from ``burst.cli.main`` itself (every command and subcommand, each
parameter's type), so a command added later is covered without touching this file:
unknown flags, missing arguments, values of the wrong type, bad choices, missing files,
unknown runs, run ids that try to leave the store, malformed and unreachable stores.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from burst.cli import EXIT_INTERNAL, main, options
from burst.store import retry
from tests.helpers.sky_helpers import run_in_skypilot

UNREACHABLE = "sftp://127.0.0.1:1/nowhere"  # nothing listens on port 1
STORE = "{store}"  # each case gets a fresh empty store directory
BLOCKED = "{blocked}"  # a regular file
MISSING = "{blocked}/x"  # below a regular file: cannot exist, nor be created, even by root
SECRET = "SECRET-e7c1"  # must never be printed, nor written to a crash log
ENDPOINTS = {  # each a usage error (exit 2), never an internal one, and never echoed whole
    "endpoint not a URL": "not-a-url",
    "endpoint unparseable": "http://[::1",
    "endpoint port out of range": "http://127.0.0.1:99999",
    "endpoint with a password": f"http://user:{SECRET}@127.0.0.1:1",
    "endpoint malformed with a password": f"http:/user:{SECRET}@127.0.0.1:1",
    "endpoint bare with a password": f"user:{SECRET}@127.0.0.1:1",
    "endpoint with a signature": f"http://127.0.0.1:1/?X-Amz-Signature={SECRET}",
}
ADDRESSES = {"to", "burst_to", "index_url", "torch_index"}  # options that take a URL
USAGE = (*ENDPOINTS, "empty store", "store is a file", "unparseable store")
NUMERIC = (click.types.IntParamType, click.types.FloatParamType)
# flags that would act on the machine (install timers, packages) are never passed
SIDE_EFFECTS = {"install", "uninstall", "system"}


def commands(group: click.Group = main, prefix: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    context = click.Context(group)  # burst's commands load on use: ask the group for them
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params
                 if isinstance(p, click.Option) and p.name == name), None)


def base_args(command: click.Command, store: str) -> list[str]:
    """The least a command needs to get past parsing: its required parameters."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and param.required:
            flag = param.opts[0]
            value = {"run_id": "no-such-run", "fault": "oom@1", "store_url": store}.get(
                param.name or "", "x")
            args += [flag, value]
    for param in command.params:
        if isinstance(param, click.Argument) and param.name == "run_id":
            args.append("no-such-run")
    for param in command.params:
        if isinstance(param, click.Argument) and param.name == "command" and param.required:
            args.append("true")
    return args


def cases(path: tuple[str, ...], command: click.Command, store: str
          ) -> Iterator[tuple[str, list[str]]]:
    base = base_args(command, store)
    yield "unknown flag", [*path, "--no-such-flag", *base]
    if any(p.required for p in command.params):
        yield "nothing given", list(path)
    for param in command.params:
        if not isinstance(param, click.Option) or param.is_flag or param.name in SIDE_EFFECTS:
            continue
        flag = param.opts[0]
        if isinstance(param.type, NUMERIC):
            yield f"{flag} not a number", [*path, *base, flag, "not-a-number"]
        elif isinstance(param.type, click.Choice):
            yield f"{flag} bad choice", [*path, *base, flag, "no-such-choice"]
        elif isinstance(param.type, click.File | click.Path):
            yield f"{flag} missing file", [*path, *base, flag, MISSING]
    if _option(command, "store_url") is not None:
        yield "unknown run", [*path, *base, "--store", store]
        yield "unreachable store", [*path, *base, "--store", UNREACHABLE]
        yield "malformed store", [*path, *base, "--store", "s3://"]
        yield "unknown scheme", [*path, *base, "--store", "nosuch://x/y"]
        yield "empty store", [*path, *base, "--store", ""]
        yield "store is a file", [*path, *base, "--store", BLOCKED]
        yield "unparseable store", [*path, *base, "--store", "sftp://[::1"]
    if _option(command, "endpoint_url") is not None:
        for why, endpoint in ENDPOINTS.items():
            yield why, [*path, *base, "--store", "s3://bucket", "--endpoint-url", endpoint]
    for param in command.params:  # any other address: malformed, with a password in it
        if isinstance(param, click.Option) and param.name in ADDRESSES:
            for why, url in (("unparseable", f"ssh://u:{SECRET}@[::1"),
                             ("port out of range", f"ssh://u:{SECRET}@127.0.0.1:99999")):
                yield f"{param.opts[0]} {why}", [*path, *base, param.opts[0], url]
    for name, flag, value in (("cards", "--gpu", ""), ("cards", "--gpu", " , "),
                              ("infra", "--infra", "bogus!!"), ("infra", "--infra", "k8s/"),
                              ("infra", "--infra", "nosuchcloud/r")):
        if _option(command, name) is not None:
            yield f"{flag} {value!r}", [*path, *base, flag, value]
    if any(p.name == "run_id" for p in command.params):
        hostile = [a if a != "no-such-run" else "../../etc" for a in base]
        if hostile != base:
            yield "run id leaving the store", [*path, *hostile, "--store", store]


def all_cases() -> list[tuple[str, list[str]]]:
    return [(f"{' '.join(path)}: {why}", args)
            for path, command in commands() for why, args in cases(path, command, STORE)]


# Some commands accept an unknown run on purpose: freezing one starts it, and a wrapper
# around a training command runs it (it reaches the store only if the command does).
ACCEPTS_NEW_RUN = {"freeze", "run", "drill", "node setup", "node run", "schedule"}
WRAPPERS = {"run", "drill"}


def _allowed_success(case: str) -> bool:
    name, why = case.split(": ", 1)
    if why == "unreachable store":
        return name in WRAPPERS
    return why in ("unknown run", "run id leaving the store") and name in ACCEPTS_NEW_RUN


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private home, config and working directory; retries without waiting."""
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("BURST_FREEZE", "0")
    for name in ("BURST_STORE", "BURST_LOCAL", "BURST_RUN_ID", "BURST_FAULT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(retry.RetryPolicy, "delay", lambda self, attempt, rng=None: 0.0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty-store").mkdir()
    (tmp_path / "blocked").write_text("a file, not a directory")
    return tmp_path


def test_every_command_fails_bad_input_in_one_line(isolated: Path) -> None:
    runner = CliRunner()
    table = all_cases()
    assert len(table) > 60
    problems = []
    for n, (case, args) in enumerate(table):
        fill = {"store": str(isolated / "stores" / str(n)), "blocked": str(isolated / "blocked")}
        (isolated / "stores" / str(n)).mkdir(parents=True)
        args = [a.format(**fill) if "{" in a else a for a in args]
        result = runner.invoke(main, args, catch_exceptions=True)
        output = result.output
        errors = [line for line in output.splitlines() if line.startswith("Error")]
        if SECRET in output:
            problems.append(f"{case}: printed the secret: {output[-300:]!r}")
        if result.exit_code == 0 and _allowed_success(case):
            continue
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(f"{case}: raised {result.exception!r}")
        elif result.exit_code in (0, EXIT_INTERNAL):
            problems.append(f"{case}: exit {result.exit_code}: {output[-300:]!r}")
        elif "Traceback" in output or len(errors) != 1:
            problems.append(f"{case}: not one error line: {output[-300:]!r}")
        elif case.split(": ", 1)[1] in USAGE and result.exit_code != 2:
            problems.append(f"{case}: exit {result.exit_code}, not 2: {output[-300:]!r}")
    logs = isolated / "xdg_state_home" / "burst" / "logs"
    crash_logs = sorted(logs.iterdir()) if logs.is_dir() else []
    problems += [f"{log.name}: holds the secret" for log in crash_logs
                 if SECRET in log.read_text()]
    failed = {line.split(": ", 1)[0] + ": " + line.split(": ", 2)[1] for line in problems}
    print(f"\n{len(table)} bad-input cases over {len(list(commands()))} commands: "
          f"{len(table) - len(failed)} passed")
    assert not problems, "\n".join(problems)


def test_an_internal_error_is_one_line_and_a_private_log(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from burst.snapshot import catalog

    def broken(*_: object) -> None:
        raise ZeroDivisionError("the bug, near https://user:hunter2@example.com/x")

    monkeypatch.setattr(catalog, "list_runs", broken)
    monkeypatch.setattr("burst.cli.snapshots.list_runs", broken)
    result = CliRunner().invoke(main, ["ls", "--store", str(isolated / "empty-store")])
    assert result.exit_code == EXIT_INTERNAL
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: internal error in burst")
    assert "ZeroDivisionError" in lines[0] and "hunter2" not in lines[0]
    log = Path(lines[0].split("the traceback is in ")[1].split(";")[0])
    assert log.is_relative_to(isolated / "xdg_state_home" / "burst" / "logs")
    text = log.read_text()
    assert "Traceback" in text and "broken" in text and "hunter2" not in text
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_an_unwritable_path_is_one_line_not_an_internal_error(isolated: Path) -> None:
    if os.geteuid() == 0:
        blocked = "/proc/burst-cannot-write-here"
    else:
        (isolated / "ro").mkdir(mode=0o500)
        blocked = str(isolated / "ro" / "store")
    result = CliRunner().invoke(main, ["gc", "run", "--store", blocked])
    assert result.exit_code not in (0, EXIT_INTERNAL)
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def _without_file_permission_override() -> list[str]:
    """A command prefix under which permission bits bind. Tests run as root, which reads
    anything through CAP_DAC_OVERRIDE; without it (and CAP_DAC_READ_SEARCH) root is an
    ordinary owner, while the interpreter under /root stays readable to it."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"],
                                                         check=False).returncode != 0:
        pytest.skip("root cannot drop the capability to read anything here")
    return prefix


@pytest.mark.parametrize(("unreadable", "args"), [
    ("store", ["ls"]),
    ("store", ["ls", "run"]),
    ("store/run/snapshots", ["ls"]),
    ("store/run/snapshots", ["ls", "run"]),
])
def test_an_unreadable_store_is_permission_denied_not_empty(
        isolated: Path, unreadable: str, args: list[str]) -> None:
    prefix = _without_file_permission_override()
    snapshots = isolated / "store" / "run" / "snapshots"
    snapshots.mkdir(parents=True)
    (snapshots / "00000001.json").write_text("{}")
    (isolated / unreadable).chmod(0)
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "burst.cli", *args, "--store",
                               str(isolated / "store")], capture_output=True, text=True,
                              timeout=120, check=False)
    finally:
        (isolated / unreadable).chmod(0o700)
    assert done.returncode not in (0, EXIT_INTERNAL), done.stdout
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "permission denied" in done.stderr.lower()


def test_report_of_a_missing_run_is_an_error_and_writes_nothing(isolated: Path) -> None:
    result = CliRunner().invoke(main, ["report", "nope", "--store", str(isolated / "empty-store"),
                                       "--out", str(isolated / "report")])
    assert result.exit_code == 1
    assert result.output.strip() == (f"Error: run 'nope' has nothing in "
                                     f"{(isolated / 'empty-store').as_uri()}")
    assert not (isolated / "report").exists()


def test_the_infra_check_knows_every_skypilot_cloud() -> None:
    """Read from SkyPilot's source, not imported: importing SkyPilot takes seconds."""
    where = run_in_skypilot("import importlib.util\n"
                            "RESULT = importlib.util.find_spec('sky').submodule_search_locations[0]")
    source = Path(where, "skylet", "constants.py").read_text()
    clouds = next(ast.literal_eval(node.value) for node in ast.parse(source).body
                  if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "ALL_CLOUDS" for t in node.targets))
    assert sorted(options.SKYPILOT_CLOUDS) == sorted(clouds)


@pytest.mark.parametrize("args", [["ls"], ["ls", "run"], ["status"], ["status", "run"],
                                  ["show", "run"], ["verify", "run"], ["report", "run"]])
def test_a_store_folder_that_does_not_exist_is_an_error_not_an_empty_store(
        isolated: Path, args: list[str]) -> None:
    missing = isolated / "no-such-store"
    result = CliRunner().invoke(main, [*args, "--store", str(missing)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: no store at {missing.as_uri()}: the folder does not exist"]
    assert not missing.exists()


def test_the_troubleshooting_page_names_the_folder_crash_logs_are_written_to(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from burst.cli import crashlog

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (crashlog.LOG_DIR_ENV, "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    folder = "~/" + str(crashlog.log_dir().relative_to(tmp_path)) + "/"
    page = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
    assert f"`{folder}`" in page and f"${crashlog.LOG_DIR_ENV}" in page

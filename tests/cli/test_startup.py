"""``burst`` starts at once: commands load on use, and none that only reads a store imports
torch (or a remote store's SDK).

Each check runs the real command in a fresh interpreter and reads ``sys.modules`` as the
process exits (an atexit probe); ``-X importtime`` adds through which chain of importers a
module came, so a failure names the module that pulled torch in. (importtime alone would
not do: it does not report a module loaded by ``importlib.import_module``.)
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click
import pytest
import torch

from burst.cli import COMMANDS, main
from burst.cli.lazy import FULL_WIDTH
from burst.snapshot import tiers
from burst.store import LocalStore

_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| (?P<indent> *)(?P<name>\S+)$")
_LOADED = "burst-test-loaded-modules: "
# Prints sys.modules as the process exits (the first atexit function runs last).
_AT_EXIT = ("import atexit, json, sys\n"
            f"atexit.register(lambda: print({_LOADED!r} + json.dumps(sorted(sys.modules)),"
            " file=sys.stderr))\n")
# `burst ARGV`, run as `python -m burst.cli ARGV` runs it.
_BURST = ("import runpy\n"
          "sys.argv[0] = 'burst'\n"
          "runpy.run_module('burst.cli', run_name='__main__', alter_sys=True)\n")

# What a command that only looks at or moves snapshots must never load.
REMOTE_ONLY = ("boto3", "botocore", "paramiko", "fsspec", "gcsfs", "matplotlib", "sky",
               "jinja2")


class Ran:
    """A finished ``burst`` process: its result, the modules it held at exit, and
    importtime's (depth, module) rows."""

    def __init__(self, done: subprocess.CompletedProcess) -> None:
        self.done = done
        self.rows = [(len(m["indent"]) // 2, m["name"])
                     for m in map(_IMPORT_LINE.match, done.stderr.splitlines()) if m]
        lines = [line for line in done.stderr.splitlines() if line.startswith(_LOADED)]
        self.loaded: set[str] = set(json.loads(lines[-1][len(_LOADED):])) if lines else set()
        assert lines, f"the probe printed no module list:\n{self.error}"

    @property
    def error(self) -> str:
        return "\n".join(line for line in self.done.stderr.splitlines()
                         if not line.startswith(("import time:", _LOADED)))[-2000:]

    def why(self, module: str) -> str:
        """``module``'s import chains, or a note that it was loaded (not how)."""
        return "; ".join(chains(self.rows, module)) or f"{module} (by importlib)"


def python(code: str, argv: list[str], cwd: Path) -> Ran:
    """Run ``python -X importtime -c CODE ARGV``, CODE behind the probe of sys.modules."""
    return Ran(subprocess.run([sys.executable, "-X", "importtime", "-c", _AT_EXIT + code,
                               *argv],
                              capture_output=True, text=True, cwd=cwd, timeout=120,
                              check=False, env=_env(cwd)))


def burst(argv: list[str], cwd: Path) -> Ran:
    return python(_BURST, argv, cwd)


def _env(cwd: Path) -> dict[str, str]:
    """No BURST_* settings of the caller's; state, logs and config inside the test."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    return {**keep, "XDG_STATE_HOME": str(cwd / "state"), "BURST_LOG_DIR": str(cwd / "logs"),
            "BURST_CONFIG": str(cwd / "no-config.toml"), "BURST_OFFLINE": "1"}


def chains(rows: list[tuple[int, str]], wanted: str) -> list[str]:
    """``torch <- burst.snapshot.tensors <- burst.snapshot.tiers``: who imported ``wanted``.

    importtime lists a module after everything it imported, one level deeper, so a row's
    importer is the next row one level up.
    """
    found = []
    for index, (depth, name) in enumerate(rows):
        if name != wanted:
            continue
        chain, level = [name], depth - 1
        for up_depth, up_name in rows[index + 1:]:
            if level < 0:
                break
            if up_depth == level:
                chain.append(up_name)
                level -= 1
        found.append(" <- ".join(chain))
    return found


# -- a local store with one small snapshot ------------------------------------------------

@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """``local`` and ``remote`` each hold run ``r`` with one small snapshot (step 10) that
    carries what ``plan`` and ``schedule`` read: card, batch layout, counters."""
    root = tmp_path_factory.mktemp("startup")
    paths = {"local": root / "local", "remote": root / "remote"}
    for path in paths.values():
        tiers.write_snapshot(LocalStore(path), "r", _captured())
    return paths


def _captured() -> tiers.Captured:
    tensors = {"w": torch.arange(16, dtype=torch.float32)}
    return tiers.Captured(10, {"model": {"w": {"$tensor": "w"}}}, tensors, {
        "reason": "periodic", "card": "NVIDIA L4", "amp": {"dtype": "bf16"},
        "counters": {"step": 10, "epoch": 0, "total_steps": 100, "samples_consumed": 80,
                     "samples_in_epoch": 80},
        "batch": {"global": 8, "micro": 8, "accumulation": 1, "world_size": 1},
        "sampler": {"num_samples": 800, "seed": 0, "shuffle": True, "drop_last": False}})


def _deadline() -> str:
    soon = datetime.now(timezone.utc) + timedelta(hours=3)
    return soon.isoformat(timespec="minutes")


# name -> argv, with {local}, {remote}, {fresh} (an empty directory) and {deadline} filled in
STORE_COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "ls": ["ls", "--store", "{local}"],
    "ls RUN": ["ls", "r", "--store", "{local}"],
    "ls --json": ["ls", "r", "--json", "--store", "{local}"],
    "show": ["show", "r", "--store", "{local}"],
    "verify": ["verify", "r", "--store", "{local}"],
    "status": ["status", "--store", "{local}"],
    "status RUN": ["status", "r", "--store", "{local}"],
    "gc": ["gc", "r", "--dry-run", "--store", "{local}"],
    "plan": ["plan", "r", "--offline", "--store", "{local}"],
    "schedule": ["schedule", "r", "--deadline", "{deadline}", "--dry-run", "--store",
                 "{remote}", "--local", "{local}"],
    "push": ["push", "r", "--store", "{fresh}", "--local", "{local}"],
    "pull": ["pull", "r", "--store", "{remote}", "--local", "{fresh}"],
    **{f"{name} --help": [name, "--help"]
       for name in ("ls", "show", "verify", "status", "gc", "plan", "schedule", "push",
                    "pull")},
}


def run_command(name: str, stores: dict[str, Path], tmp_path: Path) -> Ran:
    values = {"local": str(stores["local"]), "remote": str(stores["remote"]),
              "fresh": str(tmp_path / "fresh"), "deadline": _deadline()}
    ran = burst([arg.format(**values) for arg in STORE_COMMANDS[name]], tmp_path)
    assert ran.done.returncode == 0, ran.error
    return ran


@pytest.mark.parametrize("name", list(STORE_COMMANDS))
def test_a_command_that_only_reads_or_moves_snapshots_never_imports_torch(name, stores,
                                                                           tmp_path):
    ran = run_command(name, stores, tmp_path)
    assert "torch" not in ran.loaded, f"burst {name} imported {ran.why('torch')}"


@pytest.mark.parametrize("name", ["run", "drill", "resume", "node"])
def test_the_help_of_a_command_that_launches_training_elsewhere_never_imports_torch(
        name, tmp_path):
    ran = burst([name, "--help"], tmp_path)
    assert ran.done.returncode == 0, ran.error
    assert "torch" not in ran.loaded, f"burst {name} --help imported {ran.why('torch')}"


@pytest.mark.parametrize("name", list(STORE_COMMANDS))
def test_a_command_on_a_local_store_imports_no_remote_store_sdk_or_chart_library(
        name, stores, tmp_path):
    ran = run_command(name, stores, tmp_path)
    heavy = [ran.why(module) for module in REMOTE_ONLY if module in ran.loaded]
    assert not heavy, f"burst {name} imported {heavy}"


@pytest.mark.parametrize("name", ["help", "ls --json", "show", "gc"])
def test_a_command_that_draws_no_table_never_loads_rich(name, stores, tmp_path):
    ran = run_command(name, stores, tmp_path)
    assert "rich" not in ran.loaded, f"burst {name} imported {ran.why('rich')}"


def test_importing_burst_its_store_and_its_cli_imports_no_torch(tmp_path):
    ran = python("import burst, burst.cli, burst.store\n", [], tmp_path)
    assert ran.done.returncode == 0, ran.error
    assert "torch" not in ran.loaded, ran.why("torch")


# -- the lazy command table ---------------------------------------------------------------

def test_burst_help_imports_no_command_module(tmp_path):
    ran = burst(["--help"], tmp_path)
    assert ran.done.returncode == 0, ran.error
    modules = {entry.target.partition(":")[0] for entry in COMMANDS.values()}
    assert not modules & ran.loaded


def test_a_commands_help_imports_its_module_and_no_other(tmp_path):
    ran = burst(["gc", "--help"], tmp_path)
    assert ran.done.returncode == 0, ran.error
    modules = {entry.target.partition(":")[0] for entry in COMMANDS.values()}
    assert modules & ran.loaded == {"burst.cli.gc"}


def test_burst_help_lists_every_command_with_its_short_help(tmp_path):
    done = burst(["--help"], tmp_path).done
    listed = dict(re.findall(r"^  (\S+)\s+(.+)$", done.stdout.partition("Commands:")[2], re.M))
    assert sorted(listed) == sorted(COMMANDS)
    for name, text in listed.items():
        assert COMMANDS[name].short_help.startswith(text.removesuffix("...")), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_tables_short_help_is_the_commands_own(name):
    module, _, attribute = COMMANDS[name].target.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    assert command.name == name
    assert COMMANDS[name].short_help == command.get_short_help_str(FULL_WIDTH)


def test_the_table_names_every_command_its_modules_define():
    modules = {entry.target.partition(":")[0] for entry in COMMANDS.values()}
    defined = {command.name for module in modules
               for command in importlib.import_module(module).COMMANDS}
    assert defined == set(COMMANDS)


def test_the_help_page_lists_what_an_eagerly_built_group_would():
    eager = click.Group("burst")
    for name in main.list_commands(click.Context(main)):
        eager.add_command(main.get_command(click.Context(main), name), name)
    pages = []
    for group in (main, eager):
        formatter = click.HelpFormatter(width=80)
        group.format_commands(click.Context(group), formatter)
        pages.append(formatter.getvalue())
    assert pages[0] == pages[1] and "Commands:" in pages[0]

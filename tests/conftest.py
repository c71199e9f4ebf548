"""Shared test helpers: run the example training program in a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from burst.inputs import part as inputs_part
from burst.snapshot import priority
from burst.store import memory

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "scripts" / "example_train.py"

# Session fixtures for the store tests: real S3 servers and OpenSSH on 127.0.0.1.
pytest_plugins = ["tests.helpers.store_servers", "tests.helpers.sealed_project", "tests.helpers.node_world"]
# No wheelhouse unless a test asks for one (the policy follows a resumed run to its node).
os.environ.setdefault("BURST_WHEELS", "none")
# Tests never reach the internet: a package index that a test (or a node it starts) would
# ask by accident is a dead port on loopback. Local wheel directories still answer.
DEAD_INDEX = "http://127.0.0.1:9/simple/"
os.environ.setdefault("PIP_INDEX_URL", DEAD_INDEX)
os.environ.setdefault("UV_INDEX_URL", DEAD_INDEX)
os.environ.setdefault("PIP_RETRIES", "0")
# The CLI prints whole tables off a terminal and fits them to $COLUMNS when it is set
# (burst.cli.console); pytest-xdist's workers inherit COLUMNS=80, and so may a developer's
# shell: the tests print as a CI log does, unless a test sets a width itself.
os.environ.pop("COLUMNS", None)
# The persister runs at idle CPU priority (burst.snapshot.priority), which on a machine the
# suite itself loads past its cores would leave snapshots waiting for other tests to end:
# the suite keeps it at normal priority, and tests/snapshot/test_persister_priority.py
# checks the idle one.
os.environ.setdefault(priority.ENV_PRIORITY, priority.NORMAL)
# SkyPilot lives in its own environment (its click pin clashes with transformers):
# scripts/setup.sh makes .venv-sky; burst finds it here (burst.launch.skyenv).
if (ROOT / ".venv-sky" / "bin" / "python").exists():
    os.environ.setdefault("BURST_SKYPILOT_PYTHON", str(ROOT / ".venv-sky" / "bin" / "python"))
# The planner reads SkyPilot's cached catalogs when a machine has them (~/.sky/catalogs):
# tests plan against the embedded table, or against a catalog fixture they name.
os.environ.setdefault("BURST_SKYPILOT_CATALOG", str(ROOT / "tests" / "plan" / "no-catalog"))


def run_example(workdir: Path, run_id: str, *args: str, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    """Run scripts/example_train.py; records go to <workdir>/<run_id>.jsonl."""
    cmd = [sys.executable, str(EXAMPLE), "--run-id", run_id, "--store", str(workdir / "store"),
           "--records", str(workdir / f"{run_id}.jsonl"), "--final", str(workdir / f"{run_id}.pt"),
           "--flush", *args]
    full_env = {**os.environ, "PYTHONHASHSEED": "0", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=240,
                          check=False)


def step_records(path: Path) -> list[dict]:
    """Per-step records; a step replayed after a crash replaces the crashed attempt's."""
    latest: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        latest[record["step"]] = record
    return [latest[k] for k in sorted(latest)]


def final_state(workdir: Path, run_id: str) -> dict:
    return torch.load(workdir / f"{run_id}.pt", weights_only=True)


def assert_same(a: object, b: object, path: str = "") -> None:
    """Bitwise equality of nested state (tensors compared with torch.equal and dtype)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture(autouse=True)
def no_inputs_recording_leaks() -> Iterator[None]:
    """A run a test never closed stops recording when the test ends: its process-wide
    recorder would otherwise name the next test's files as that run's inputs, and its
    staging thread print into the next test's captured output."""
    yield
    inputs_part.reset()


@pytest.fixture(autouse=True)
def fresh_memory_buckets() -> None:
    """Every test starts with no ``memory://`` buckets: a name reused by two tests (or a
    test run twice) never sees what another one left there."""
    memory.reset()


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run of the example program: what a resumed run must equal."""

    workdir: Path
    records: list[dict]  # per optimizer step: indices, loss...
    final: dict  # the final model and optimizer state


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Callable[..., Reference]:
    """``uninterrupted(*example_args)``: the uninterrupted run for those arguments, trained
    once per session and shared by every test that compares against it."""
    cache: dict[tuple[str, ...], Reference] = {}

    def reference(*args: str) -> Reference:
        if args not in cache:
            workdir = tmp_path_factory.mktemp("reference")
            done = run_example(workdir, "reference", *args)
            assert done.returncode == 0, done.stderr
            cache[args] = Reference(workdir, step_records(workdir / "reference.jsonl"),
                                    final_state(workdir, "reference"))
        return cache[args]

    return reference

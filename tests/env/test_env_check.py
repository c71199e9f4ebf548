"""``burst env check``: the live environment against a lockfile, differences by severity."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.env import check as envcheck
from burst.env import lockfile
from burst.env.lockfile import Package


@pytest.fixture(scope="module")
def live() -> envcheck.Live:
    return envcheck.live_here()


def _doctor(lock: lockfile.Lockfile, **versions: str | None) -> lockfile.Lockfile:
    """A copy of ``lock`` with packages re-versioned (None: removed) or added."""
    packages = {p.name: p for p in lock.packages}
    for name, version in versions.items():
        name = name.replace("_", "-")
        if version is None:
            packages.pop(name)
        else:
            packages[name] = dataclasses.replace(packages.get(name, Package(name, "")),
                                                 version=version)
    return dataclasses.replace(lock, packages=sorted(packages.values(), key=lambda p: p.name))


def _write(tmp_path: Path, lock: lockfile.Lockfile) -> str:
    path = tmp_path / "lock.json"
    path.write_bytes(lock.dumps())
    return str(path)


def _torch_bumped(version: str, part: int) -> str:
    numbers = [int(x) for x in version.partition("+")[0].split(".")]
    numbers[part] += 1
    return ".".join(map(str, numbers))


def test_check_is_clean_on_the_environment_it_froze(frozen, live, tmp_path):
    assert envcheck.compare(frozen, live) == []
    result = CliRunner().invoke(main, ["env", "check", "--lockfile", _write(tmp_path, frozen)])
    assert result.exit_code == 0, result.output
    assert "clean" in result.output


def test_check_lists_exactly_the_differences_of_a_doctored_lockfile(frozen, live):
    torch_version = frozen.package("torch").version
    doctored = _doctor(frozen, numpy="0.0.1", click=None, ghost_pkg="1.0",
                       torch=_torch_bumped(torch_version, 1))
    found = {(d.severity, d.what, d.recorded, d.live)
             for d in envcheck.compare(doctored, live)}
    assert found == {
        ("warning", "torch", _torch_bumped(torch_version, 1), live.packages["torch"]),
        ("warning", "numpy", "0.0.1", live.packages["numpy"]),
        ("warning", "ghost-pkg", "1.0", None),
        ("note", "click", None, live.packages["click"]),
    }


def test_torch_major_change_is_an_error_with_a_non_zero_exit(frozen, tmp_path):
    doctored = _doctor(frozen, torch=_torch_bumped(frozen.package("torch").version, 0))
    result = CliRunner().invoke(main, ["env", "check", "--lockfile", _write(tmp_path, doctored)])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: 1 difference(s) break the run's snapshots: torch")
    assert "Traceback" not in result.output


def test_other_snapshot_format_is_an_error(frozen, live):
    doctored = dataclasses.replace(frozen, burst={**frozen.burst, "snapshot_format": 99})
    differences = envcheck.compare(doctored, live)
    assert [(d.severity, d.what) for d in differences] == [("error", "burst snapshot format")]


def test_a_run_frozen_by_an_older_burst_passes_on_a_newer_one(frozen, live):
    # an older burst wrote format 1 (SHA-256); this one writes format 3 and reads both
    doctored = dataclasses.replace(frozen, burst={**frozen.burst, "snapshot_format": 1})
    assert "burst snapshot format" not in [d.what for d in envcheck.compare(doctored, live)]


def test_warnings_pass_unless_strict(frozen, tmp_path):
    path = _write(tmp_path, _doctor(frozen, numpy="0.0.1"))
    assert CliRunner().invoke(main, ["env", "check", "--lockfile", path]).exit_code == 0
    strict = CliRunner().invoke(main, ["env", "check", "--lockfile", path, "--strict"])
    assert strict.exit_code == 1 and "--strict" in strict.output


def test_check_json_lists_the_differences(frozen, tmp_path):
    path = _write(tmp_path, _doctor(frozen, numpy="0.0.1"))
    result = CliRunner().invoke(main, ["env", "check", "--lockfile", path, "--json"])
    data = json.loads(result.output)
    assert (data["errors"], data["warnings"], data["notes"]) == (0, 1, 0)
    assert data["differences"][0]["what"] == "numpy"


def test_translated_torch_build_and_its_libraries_are_notes_not_warnings(frozen, live):
    base = live.packages["torch"].partition("+")[0]
    doctored = _doctor(frozen, torch=f"{base}+cu128", nvidia_cublas_cu12="12.8.4.1")
    doctored.packages[:] = [dataclasses.replace(p, torch_coupled=True)
                            if p.name == "nvidia-cublas-cu12" else p for p in doctored.packages]
    severities = {d.what: d.severity for d in envcheck.compare(doctored, live)}
    assert severities == {"torch": "note", "nvidia-cublas-cu12": "note"}


def test_check_without_a_run_or_lockfile_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.delenv("BURST_RUN_ID", raising=False)
    result = CliRunner().invoke(main, ["env", "check"])
    assert result.exit_code == 2
    assert result.output.strip() == "Error: name a run (or $BURST_RUN_ID), or give --lockfile FILE"


def test_check_of_a_run_without_a_frozen_environment_names_the_fix(tmp_path):
    result = CliRunner().invoke(main, ["env", "check", "nofrz", "--store", str(tmp_path)])
    assert result.exit_code == 1
    assert "run `burst freeze nofrz`" in result.output and len(result.output.splitlines()) == 1

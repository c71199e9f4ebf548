"""The ``burst`` command: version, help, snapshot listing, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import burst
from burst.cli import main


@pytest.fixture
def run_store(tmp_path):
    run = burst.Run("demo", store=tmp_path, global_batch=2)
    run.attach(torch.nn.Linear(2, 2))
    run.snapshot(wait=True)
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_version_and_help():
    assert invoke("--version").output.strip() == f"burst, version {burst.__version__}"
    result = invoke("--help")
    assert result.exit_code == 0 and "verify" in result.output


def test_ls_lists_complete_snapshots_as_json(run_store):
    result = invoke("ls", "demo", "--store", str(run_store), "--json")
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [r["step"] for r in rows] == [0] and rows[0]["reason"] == "manual"


def test_verify_passes_on_an_intact_snapshot(run_store):
    result = invoke("verify", "demo", "--store", str(run_store))
    assert result.exit_code == 0 and result.output.startswith("ok: demo step 0")


def one_line_error(*args: str) -> tuple[int, str]:
    """Run the real executable: what a user sees, traceback or not."""
    done = subprocess.run([sys.executable, "-m", "burst.cli", *args], capture_output=True,
                          text=True, check=False)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def test_a_corrupt_blob_is_a_one_line_error(run_store):
    blob = next(p for p in (run_store / "demo" / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    code, line = one_line_error("verify", "demo", "--store", str(run_store))
    assert code == 1 and ("corrupt" in line or "bytes" in line)


def test_an_unknown_format_version_is_a_one_line_error(run_store):
    manifest = run_store / "demo" / "snapshots" / "000000000000.json"
    data = json.loads(manifest.read_text())
    data["format"] = 99
    manifest.write_text(json.dumps(data))
    code, line = one_line_error("show", "demo", "--store", str(run_store))
    assert code == 1 and "format 99" in line


def test_a_missing_run_is_a_one_line_error(tmp_path):
    code, line = one_line_error("verify", "nope", "--store", str(tmp_path))
    assert code == 1 and "no snapshot" in line


def test_an_unsupported_store_url_is_a_usage_error(tmp_path):
    code, line = one_line_error("ls", "demo", "--store", "ftp://x/y")
    assert code == 2 and "unsupported store URL" in line

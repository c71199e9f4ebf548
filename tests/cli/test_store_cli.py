"""``burst ls/push/pull/verify/gc`` against real stores, and bad input as one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from burst.cli import main
from burst.snapshot import format as fmt
from burst.snapshot import reader
from burst.store import LocalStore
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import aws_env, free_port


@pytest.fixture
def env(seaweed, monkeypatch, tmp_path):
    """The S3 settings a user would export: credentials, endpoint, CA bundle."""
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("AWS_CA_BUNDLE", seaweed.ca_bundle)
    local = LocalStore(tmp_path / "local")
    for step, value in ((10, 1.0), (20, 2.0)):  # the frozen part is shared, the head is not
        take(local, step, {"frozen": torch.zeros(400_000), "head": torch.full((100_000,), value)},
             time=f"2026-01-01T00:00:{step}+00:00", counters={"epoch": step // 10})
    return {"local": str(local.root), "remote": seaweed.url()}


def burst(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_push_then_pull_round_trips_a_run_through_the_cli(env, tmp_path):
    pushed = burst("push", "run", "--store", env["remote"], "--local", env["local"], "--all",
                   "--json")
    assert pushed.exit_code == 0, pushed.output
    transfers = json.loads(pushed.output)
    assert [t["step"] for t in transfers] == [10, 20]
    assert transfers[1]["bytes_sent"] < transfers[0]["bytes_sent"]  # the frozen part skipped
    fresh = tmp_path / "fresh"
    pulled = burst("pull", "run", "--store", env["remote"], "--local", str(fresh))
    assert pulled.exit_code == 0 and "pulled run step 20" in pulled.output
    reader.verify(LocalStore(fresh), "run")


def test_ls_lists_runs_and_a_runs_snapshots_with_new_bytes(env):
    burst("push", "run", "--store", env["remote"], "--local", env["local"], "--all")
    runs = json.loads(burst("ls", "--store", env["remote"], "--json").output)
    assert [r["run"] for r in runs] == ["run"] and runs[0]["newest_step"] == 20
    rows = json.loads(burst("ls", "run", "--store", env["remote"], "--json").output)
    assert [r["step"] for r in rows] == [10, 20]
    assert rows[0]["new_bytes"] == rows[0]["bytes"] and rows[1]["new_bytes"] < rows[1]["bytes"]
    table = burst("ls", "run", "--store", env["remote"])
    for column in ("step", "epoch", "time", "size", "new bytes", "reason"):
        assert column in table.output


def test_verify_reports_each_snapshot_and_fails_on_a_corrupt_one(env, seaweed):
    burst("push", "run", "--store", env["remote"], "--local", env["local"], "--all")
    ok = burst("verify", "run", "--all", "--store", env["remote"], "--json")
    assert ok.exit_code == 0 and all(r["ok"] for r in json.loads(ok.output))
    store = LocalStore(env["local"])
    manifest = reader.read_manifest(store, "run", 20)
    head = manifest["tensors"]["head"]["blob"]
    from burst.store import open_store

    remote = open_store(env["remote"])
    remote.put(fmt.blob_key("run", head), b"\0" * manifest["blobs"][head]["size"])
    bad = burst("verify", "run", "--all", "--store", env["remote"])
    assert bad.exit_code != 0
    assert "ok: run step 10" in bad.output and "FAILED: run step 20" in bad.output


def test_gc_applies_the_retention_rule(env):
    burst("push", "run", "--store", env["remote"], "--local", env["local"], "--all")
    report = json.loads(burst("gc", "run", "--store", env["remote"], "--keep-last", "1",
                              "--json").output)
    assert report["kept"] == [20] and report["dropped"] == [10]
    rows = json.loads(burst("ls", "run", "--store", env["remote"], "--json").output)
    assert [r["step"] for r in rows] == [20]


BAD_INPUT = {
    "unknown scheme": ["ls", "--store", "ftp://host/x"],
    "malformed s3 url": ["ls", "--store", "s3://"],
    "invalid bucket name": ["ls", "--store", "s3://no_such!bucket/x"],
    "sftp url without a path": ["ls", "--store", "sftp://host"],
    "oss without a region": ["ls", "--store", "oss://bucket/x"],
    "missing bucket": ["ls", "run", "--store", "s3://no-such-bucket/x"],
}


def _one_line_error(result) -> str:
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_a_one_line_error_and_a_nonzero_exit(env, case, monkeypatch):
    monkeypatch.delenv("OSS_REGION", raising=False)
    line = _one_line_error(burst(*BAD_INPUT[case]))
    if case == "missing bucket":
        assert "does not exist" in line


def test_wrong_credentials_are_a_one_line_error(env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    line = _one_line_error(burst("ls", "run", "--store", env["remote"]))
    assert "access denied" in line


def test_an_unreachable_endpoint_is_a_one_line_error(env):
    line = _one_line_error(burst("ls", "run", "--store", env["remote"], "--endpoint-url",
                                 f"https://127.0.0.1:{free_port()}"))
    assert "cannot reach" in line


def test_an_untrusted_tls_certificate_is_a_one_line_error(env, monkeypatch):
    monkeypatch.delenv("AWS_CA_BUNDLE")
    line = _one_line_error(burst("ls", "run", "--store", env["remote"]))
    assert "TLS" in line


def test_the_installed_command_prints_no_traceback_for_a_bad_store(tmp_path):
    result = subprocess.run([sys.executable, "-m", "burst.cli", "ls", "--store", "s3://"],
                            capture_output=True, text=True, env={**os.environ,
                                                                 "BURST_CONFIG": os.devnull})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("Error:")

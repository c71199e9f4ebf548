"""``burst check`` from the command line, one plain line per row off a terminal: a
wheelhouse missing a wheel, an SSH box whose host key changed, an offline SkyPilot, and
``--json`` for scripts. Each exits non-zero exactly when a required row does not pass."""

from __future__ import annotations

import json
import subprocess

from click.testing import CliRunner

from burst.cli import main
from burst.store import open_store
from tests.preflight.builders import frozen_run


def check(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["check", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def row(lines: list[str], name: str) -> str:
    return next(line for line in lines if line[2:].startswith(name))


def test_a_wheel_missing_from_the_wheelhouse_fails_naming_it(tmp_path):
    store = open_store(str(tmp_path / "store"))
    wheels = frozen_run(store, "r", tmp_path)
    store.delete(wheels[0].key)
    code, lines = check("r", "--store", store.url, "--to", "local")
    assert code == 1
    line = row(lines, "wheelhouse")
    assert line.startswith("✗ wheelhouse: fail") and wheels[0].file in line
    assert wheels[1].file not in line


def test_an_ssh_box_whose_host_key_changed_fails(sshd, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} "
                     + " ".join((tmp_path / "k.pub").read_text().split()[:2]) + "\n")
    code, lines = check("--store", str(tmp_path / "store"), "--to", "ssh://burst-test",
                        "--ssh-config", str(sshd.config), "--known-hosts", str(known))
    assert code == 1
    line = row(lines, "ssh ")
    assert line.startswith("✗ ssh") and "does NOT match" in line and "ssh-keygen -R" in line


def test_an_offline_skypilot_is_unknown_and_not_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # SkyPilot's state: a fresh one
    code, lines = check("--store", str(tmp_path / "store"), "--offline", "--sky-timeout", "3")
    assert code == 1
    assert row(lines, "skypilot clouds").startswith("? skypilot clouds: unknown")
    assert lines[-1] == "not ready: skypilot clouds"


def test_json_gives_the_verdict_and_every_row(tmp_path):
    result = CliRunner().invoke(main, ["check", "--store", str(tmp_path / "store"), "--to",
                                       "local", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ready"] is True
    assert {"name", "status", "detail", "fix", "required"} <= set(report["rows"][0])

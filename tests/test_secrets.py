"""Secrets, end to end: canary credentials in the environment, the config, SSH settings
and the project directory never reach a byte burst writes or prints; SSH host keys are
verified; local snapshots are owner-only.

A real training run (``scripts/example_train.py``) snapshots through the local tier to an
S3 server, then every inspecting command runs, ``burst resume --dry-run`` renders its
task, and a bug writes a crash log. Every file under the test's directory (compressed
archives opened) and every object in the bucket is searched for each canary.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import crashlog, main
from burst.errors import StoreError
from burst.redact import scrub_text, strip_url
from burst.store import open_store
from tests.conftest import EXAMPLE
from tests.helpers.store_servers import BUCKET, SSHServer

# values made at run time: the test's own source is archived with the run's code, and
# must not hold them
_TAG = os.urandom(4).hex()
CANARIES = {name: f"CANARY-{name.lower()}-{_TAG}" for name in (
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "OSS_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "HF_TOKEN", "WANDB_API_KEY", "GITHUB_TOKEN")}
FILE_CANARIES = tuple(f"CANARY-{what}-{_TAG}" for what in ("ssh-key", "dotenv", "gcp-sa"))


def _contents(root: Path) -> list[tuple[str, bytes]]:
    """Every file under ``root`` (tar and gzip archives opened too)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found.extend(_expand(str(path), path.read_bytes()))
    return found


def _expand(name: str, data: bytes) -> list[tuple[str, bytes]]:
    out = [(name, data)]
    if data[:2] == b"\x1f\x8b":
        with contextlib.suppress(OSError):
            out.extend(_expand(name + "!gunzip", gzip.decompress(data)))
    elif len(data) > 262 and data[257:262] == b"ustar":
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    out.append((f"{name}!{member.name}", extracted.read()))
    return out


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_s3) -> dict[str, str]:
    """Canaries in the environment, an SSH config, a project directory; S3 settings."""
    project = tmp_path / "project"
    (project / ".aws").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / ".env").write_text(f"TOKEN={FILE_CANARIES[1]}\n")
    (project / ".aws" / "credentials").write_text(f"secret={FILE_CANARIES[0]}\n")
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{FILE_CANARIES[0]}\n")
    (ssh / "config").write_text(f"Host lab\n  HostName 127.0.0.1\n  IdentityFile {ssh}/id_ed25519\n")
    (tmp_path / "sa.json").write_text(f'{{"private_key": "{FILE_CANARIES[2]}"}}')
    env = {**CANARIES, "AWS_ACCESS_KEY_ID": "burst-test-key", "AWS_DEFAULT_REGION": "us-east-1",
           "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "sa.json"),
           "BURST_SSH_CONFIG": str(ssh / "config"), "BURST_ENDPOINT_URL": moto_s3.endpoint,
           "BURST_ADDRESSING_STYLE": "path", "BURST_LOCAL": str(tmp_path / "local"),
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "BURST_CONFIG": str(tmp_path / "config.toml"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HOME": str(tmp_path / "home")}
    (tmp_path / "config.toml").write_text(
        f'[stores.lab]\nurl = "s3://{BUCKET}/lab"\nendpoint_url = "{moto_s3.endpoint}"\n')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(project)
    return env


@pytest.mark.e2e
def test_no_canary_reaches_any_file_or_output(planted: dict[str, str], tmp_path: Path,
                                              moto_s3) -> None:
    store = f"s3://{BUCKET}/secrets-{os.getpid()}"
    train = subprocess.run(
        [sys.executable, str(EXAMPLE), "--run-id", "sec", "--store", store, "--records",
         str(tmp_path / "rec.jsonl"), "--final", str(tmp_path / "final.pt"), "--flush",
         "--epochs", "1", "--samples", "32"],
        capture_output=True, text=True, timeout=240, check=False, env=dict(os.environ))
    assert train.returncode == 0, train.stderr[-2000:]
    runner, printed = CliRunner(), [train.stdout, train.stderr]
    for args in (["ls", "--store", store], ["ls", "sec", "--store", store],
                 ["show", "sec", "--store", store], ["verify", "sec", "--store", store],
                 ["status", "sec", "--store", store], ["gc", "sec", "--store", store, "--dry-run"],
                 ["pull", "sec", "--store", store, "--local", str(tmp_path / "pulled")],
                 ["env", "check", "sec", "--store", store],
                 ["report", "sec", "--store", store, "--out", str(tmp_path / "report")],
                 ["resume", "sec", "--store", store, "--to", "local", "--dry-run", "--offline",
                  "--", "python", "train.py"],
                 ["ls", "--store", "sftp://lab/x"]):
        printed.append(runner.invoke(main, args).output)
    printed.append(str(crashlog.write(RuntimeError(f"bug near {store}"))))
    written = _contents(tmp_path)
    remote = open_store(store)
    written += [(key, remote.get(key)) for key in remote.list("")]
    leaks = [(name, canary) for canary in (*CANARIES.values(), *FILE_CANARIES)
             for name, data in [*written, *(("output", p.encode()) for p in printed)]
             if canary.encode() in data and not _planted_by_test(name, tmp_path)]
    assert len(written) > 20
    assert leaks == []


def _planted_by_test(name: str, tmp_path: Path) -> bool:
    planted = (tmp_path / "project" / ".env", tmp_path / "project" / ".aws" / "credentials",
               tmp_path / "ssh" / "id_ed25519", tmp_path / "sa.json")
    return any(name == str(p) for p in planted)


def test_local_snapshots_are_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import burst

    monkeypatch.setenv("BURST_FREEZE", "0")
    old = os.umask(0o022)
    try:
        run = burst.Run("private", store=tmp_path / "a" / "store", global_batch=2)
        run.attach(torch.nn.Linear(3, 3))
        run.snapshot("manual", wait=True)
    finally:
        os.umask(old)
    root = tmp_path / "a"
    modes = {p.relative_to(root): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}
    assert modes and all(mode == (0o700 if (root / p).is_dir() else 0o600)
                         for p, mode in modes.items()), modes


def _sftp(server: SSHServer, known_hosts: Path) -> object:
    return open_store(server.url(), ssh_config=str(server.config), known_hosts=str(known_hosts))


def test_sftp_refuses_unknown_and_changed_host_keys(sshd: SSHServer, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts to fall back on
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(StoreError, match="not in known_hosts"):
        _sftp(sshd, empty).list("")  # type: ignore[attr-defined]
    wrong = tmp_path / "wrong_known_hosts"
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    with pytest.raises(StoreError, match="CHANGED"):
        _sftp(sshd, wrong).list("")  # type: ignore[attr-defined]
    assert _sftp(sshd, sshd.known_hosts).list("") == []  # type: ignore[attr-defined]


SECRET = "SECRET-4f1d"


@pytest.mark.parametrize(("url", "safe"), [
    (f"http:/user:{SECRET}@127.0.0.1:1", "http:/127.0.0.1:1"),  # one slash: still a URL
    (f"user:{SECRET}@127.0.0.1:1", "user@127.0.0.1:1"),
    (f"http:user:{SECRET}@127.0.0.1", "http@127.0.0.1"),
    (f"http://u:{SECRET}@[::1", "http://[::1"),  # unparseable: stripped, not replaced
    ("http://127.0.0.1:99999/x", "http://127.0.0.1:99999/x"),  # a bad port stays in the echo
    (f"https://b.example/k?X-Amz-Signature={SECRET}#f", "https://b.example/k"),
])
def test_strip_url_strips_malformed_urls_and_keeps_what_was_typed(url: str, safe: str) -> None:
    assert strip_url(url) == safe


@pytest.mark.parametrize(("text", "safe"), [
    (f"Invalid endpoint: user:{SECRET}@127.0.0.1:1", "Invalid endpoint: user@127.0.0.1:1"),
    (f"Custom endpoint `http://u:{SECRET}@h:99999` was not a valid URI",
     "Custom endpoint `http://h:99999` was not a valid URI"),
    (f"(see https://u:{SECRET}@h/x).", "(see https://h/x)."),
    (f"burst ls --endpoint-url=http:/u:{SECRET}@h --token={SECRET} password={SECRET}",
     "burst ls --endpoint-url=http:/h --token=*** password=***"),
    (f"GET /k?X-Amz-Credential=AKIA/x&X-Amz-Signature={SECRET} 403",
     "GET /k?X-Amz-Credential=***&X-Amz-Signature=*** 403"),
    ("step 7 at 12:30, mail me@example.com", "step 7 at 12:30, mail me@example.com"),
])
def test_scrub_text_masks_every_credential_form_in_a_message(text: str, safe: str) -> None:
    assert scrub_text(text) == safe


def test_a_crash_log_holds_no_secret_from_the_error_or_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(crashlog.LOG_DIR_ENV, str(tmp_path))
    argv = ["burst", "ls", "--endpoint-url", f"http:/user:{SECRET}@127.0.0.1:1",
            f"--url=https://h/x?Signature={SECRET}"]
    path = crashlog.write(ValueError(f"Invalid endpoint: user:{SECRET}@127.0.0.1:1"), argv)
    assert path is not None
    text = path.read_text()
    assert "Invalid endpoint: user@127.0.0.1:1" in text and "http:/127.0.0.1:1" in text
    assert SECRET not in text

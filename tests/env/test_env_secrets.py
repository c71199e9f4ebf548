"""Secrets never written: canaries in the environment, index URLs, git remote and secret
files must not appear in any byte burst wrote (archives decompressed) or printed."""

from __future__ import annotations

import gzip
import re
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.redact import is_secret_path, scrub_text, strip_url
from tests.helpers.env_helpers import CANARY_FILE, CANARY_KEY, CANARY_REMOTE, make_repo

ENV_CANARIES = {
    "MY_API_TOKEN": "CANARY-env-value-1d9e",
    "AWS_SECRET_ACCESS_KEY": "CANARY-aws-secret-44aa",
    "PIP_INDEX_URL": "https://alice:CANARY-pip-pass-77@pypi.tuna.tsinghua.edu.cn/simple",
    "PIP_EXTRA_INDEX_URL": "https://mirror.example/simple?token=CANARY-query-token-31",
    "UV_INDEX": "corp=https://__token__:CANARY-uv-token-90@corp.example/simple",
    "UV_EXTRA_INDEX_URL": "https://bob@mirror2.example/simple#CANARY-fragment-5",
}
CANARIES = [CANARY_FILE, CANARY_KEY, CANARY_REMOTE, "CANARY-pipconf-pass-12",
            *[re.search(r"CANARY[-A-Za-z0-9]*", v).group(0) for v in ENV_CANARIES.values()]]


def _everything_written(root: Path) -> list[tuple[str, bytes]]:
    """Every file under ``root``; a code archive also by each of its members."""
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out.append((str(path), data))
        if path.name.endswith(".tar.gz"):
            out.append((f"{path} (decompressed)", gzip.decompress(data)))
            with tarfile.open(path) as tar:
                names = tar.getnames()
            out.append((f"{path} (names)", "\n".join(names).encode()))
    return out


def test_canary_secrets_never_appear_in_anything_burst_wrote(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nextra-index-url = "
                        "https://u:CANARY-pipconf-pass-12@pip.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(pip_conf))
    for name, value in ENV_CANARIES.items():
        monkeypatch.setenv(name, value)
    store = tmp_path / "store"
    runner = CliRunner()
    frozen = runner.invoke(main, ["freeze", "canary-run", "--store", str(store),
                                  "--code-dir", str(repo), "-o", str(tmp_path / "out.json")])
    assert frozen.exit_code == 0, frozen.output
    listed = runner.invoke(main, ["freeze", "--code-dir", str(repo)])
    planned = runner.invoke(main, ["env", "install", "canary-run", "--store", str(store),
                                   "--gpu", "H100", "--dry-run", "--json"])
    checked = runner.invoke(main, ["env", "check", "canary-run", "--store", str(store), "--json"])
    written = [*_everything_written(store), ("out.json", (tmp_path / "out.json").read_bytes())]
    assert any(name.endswith("(decompressed)") for name, _ in written)
    printed = [("freeze", frozen.output), ("freeze (stdout)", listed.output),
               ("install --dry-run", planned.output), ("check", checked.output)]
    for canary in CANARIES:
        for name, data in written:
            assert canary.encode() not in data, f"{canary} leaked into {name}"
        for name, text in printed:
            assert canary not in text, f"{canary} leaked into the output of {name}"
    lockfile = (store / "canary-run" / "env" / "lockfile.json").read_text()
    assert "https://pypi.tuna.tsinghua.edu.cn/simple" in lockfile  # the mirror itself is kept


@pytest.mark.parametrize(("url", "safe"), [
    ("https://user:pass@host.example/simple", "https://host.example/simple"),
    ("https://__token__@host.example:8443/s/?t=1#frag", "https://host.example:8443/s/"),
    ("http://[::1]:3141/root/pypi", "http://[::1]:3141/root/pypi"),
    ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
    ("user:secret@host.example:org/repo.git", "user@host.example:org/repo.git"),
    ("/opt/wheels", "/opt/wheels"),
])
def test_strip_url_removes_credentials_query_and_fragment(url, safe):
    assert strip_url(url) == safe


def test_scrub_text_strips_every_url_in_a_message():
    message = "fatal: unable to access 'https://me:tok@git.example/r.git/': 403"
    assert scrub_text(message) == "fatal: unable to access 'https://git.example/r.git/': 403"


@pytest.mark.parametrize("path", [
    ".env", "app/.env.local", "prod.env", "id_rsa", "id_ed25519.pub", "deploy/key.pem",
    "tls.KEY", ".netrc", ".pypirc", "credentials", "gcp/credentials.json", ".git-credentials",
    ".ssh/config", "home/.aws/config", ".git/config", "service-account-prod.json",
])
def test_secret_paths_are_recognised(path):
    assert is_secret_path(path)


@pytest.mark.parametrize("path", [
    "train.py", "auth/credentials.py", "keyboard.py", "envs/setup.py", "monkey.txt",
    "environment.yml", "id.py",
])
def test_code_files_are_not_taken_for_secrets(path):
    assert not is_secret_path(path)

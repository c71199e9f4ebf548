"""Code capture: the working tree as a deterministic, content-addressed, secret-free archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from burst.env import codearchive
from burst.errors import ConfigError, SnapshotError
from burst.store import MemoryStore
from tests.helpers.env_helpers import (
    CANARY_FILE,
    CANARY_KEY,
    CANARY_REMOTE,
    SECRET_FILES,
    git,
    make_repo,
    tree,
    write,
)


def _expected_tree(repo: Path) -> dict:
    """What git calls the working tree: no ignored files, no secrets."""
    ignored = {"train.log", "checkpoints/ckpt.bin"}
    return {rel: v for rel, v in tree(repo).items()
            if rel not in ignored and rel not in SECRET_FILES}


def test_archive_restores_the_working_tree_exactly_without_secrets(tmp_path):
    repo = make_repo(tmp_path / "repo")
    store = MemoryStore("code-exact")
    captured = codearchive.capture(repo)
    ref, _ = codearchive.upload(store, "r", captured)
    restored = codearchive.restore(store, "r", ref, tmp_path / "out")
    assert tree(tmp_path / "out") == _expected_tree(repo)
    assert "old.py" not in restored and "train.py" in restored
    assert (tmp_path / "out" / "train.py").read_text() == "print('v2: uncommitted')\n"
    assert sorted(ref["skipped"]) == sorted(SECRET_FILES)
    raw = gzip.decompress(captured.tar_gz)
    for canary in (CANARY_FILE, CANARY_KEY, CANARY_REMOTE):
        assert canary.encode() not in raw


def test_archive_records_commit_branch_stripped_remote_and_diff(tmp_path):
    repo = make_repo(tmp_path / "repo")
    captured = codearchive.capture(repo)
    assert captured.git == {"commit": git(repo, "rev-parse", "HEAD"), "branch": "main",
                            "remote": "https://git.example.com/t/p.git", "dirty": True}
    assert b"v2: uncommitted" in captured.diff and b"old.py" in captured.diff
    assert CANARY_REMOTE.encode() not in captured.diff


def test_unchanged_tree_gives_the_same_archive_and_is_not_uploaded_again(tmp_path):
    repo = make_repo(tmp_path / "repo")
    store = MemoryStore("code-dedup")
    first = codearchive.capture(repo)
    _, new = codearchive.upload(store, "r", first)
    os.utime(repo / "train.py", (1, 1))  # touched, not changed
    second = codearchive.capture(repo)
    _, again = codearchive.upload(store, "r", second)
    assert (new, again) == (True, False)
    assert second.digest == first.digest and second.tar_gz == first.tar_gz
    assert first.digest == hashlib.sha256(gzip.decompress(first.tar_gz)).hexdigest()


def test_changed_file_gives_a_new_archive(tmp_path):
    repo = make_repo(tmp_path / "repo")
    first = codearchive.capture(repo)
    write(repo, "model/net.py", "WIDTH = 8\n")
    assert codearchive.capture(repo).digest != first.digest


def test_archive_over_the_cap_fails_naming_the_largest_files(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "data.bin").write_bytes(b"x" * 4096)
    with pytest.raises(codearchive.CodeTooLarge) as info:
        codearchive.capture(repo, max_bytes=1024)
    message = str(info.value)
    assert "over the 0.0 MiB cap" in message and "data.bin" in message
    assert ".burstignore" in message and "\n" not in message


def test_burstignore_excludes_more(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo, ".burstignore", "# data\nmodel/new_layer.py\n*.sh\n")
    names = set(codearchive.unpack(codearchive.capture(repo).tar_gz,
                                   codearchive.capture(repo).digest, tmp_path / "o", 1 << 20))
    assert "model/new_layer.py" not in names and "run.sh" not in names
    assert "train.py" in names


def test_directory_outside_git_is_archived_without_venvs_caches_or_secrets(tmp_path):
    project = tmp_path / "plain"
    write(project, "train.py", "x = 1\n")
    write(project, ".env", f"T={CANARY_FILE}\n")
    write(project, "venv/pyvenv.cfg", "home = /usr\n")
    write(project, "venv/lib/site.py", "big = 1\n")
    write(project, "pkg/__pycache__/m.cpython-311.pyc", "junk")
    write(project, ".burst/r/events.jsonl", "{}\n")
    captured = codearchive.capture(project)
    names = codearchive.unpack(captured.tar_gz, captured.digest, tmp_path / "o", 1 << 20)
    assert names == ["train.py"]
    assert captured.git is None and captured.skipped == [{"path": ".env",
                                                          "reason": "secret file name"}]


def test_local_store_inside_the_project_is_not_archived(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo, "store/r/snapshots/1.json", "{}")
    captured = codearchive.capture(repo, exclude=[repo / "store"])
    names = codearchive.unpack(captured.tar_gz, captured.digest, tmp_path / "o", 1 << 20)
    assert not any(n.startswith("store/") for n in names)


def test_home_directory_is_never_archived(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="refusing to archive"):
        codearchive.capture(tmp_path)


def test_restore_refuses_an_archive_that_does_not_match_its_hash(tmp_path):
    repo = make_repo(tmp_path / "repo")
    captured = codearchive.capture(repo)
    with pytest.raises(SnapshotError, match="does not match its hash"):
        codearchive.unpack(captured.tar_gz, "0" * 64, tmp_path / "o", 1 << 20)


def test_restore_refuses_members_escaping_the_destination(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    raw = buffer.getvalue()
    with pytest.raises(SnapshotError, match="unsafe"):
        codearchive.unpack(gzip.compress(raw), hashlib.sha256(raw).hexdigest(),
                           tmp_path / "o", 1 << 20)
    assert not (tmp_path / "escaped.txt").exists()


def test_symlink_leaving_the_project_is_skipped(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "outside").symlink_to("/etc/hostname")
    captured = codearchive.capture(repo)
    assert {"path": "outside", "reason": "symlink leaving the project"} in captured.skipped


def test_code_that_merely_mentions_a_key_marker_is_archived(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo, "keyparse.py", 'MARKER = "-----BEGIN RSA PRIVATE KEY-----"\n')
    captured = codearchive.capture(repo)
    names = codearchive.unpack(captured.tar_gz, captured.digest, tmp_path / "o", 1 << 20)
    assert "keyparse.py" in names and "notes/backup.txt" not in names


def _raw_tar(*members: tuple[str, str]) -> bytes:
    """A tar of ``(name, link)`` members: a file holding "hi" where link is empty, else a
    symlink to it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = 2
                tar.addfile(info, io.BytesIO(b"hi"))
    return buffer.getvalue()


@pytest.mark.parametrize("members", [
    [("../escaped.txt", "")],
    [("/tmp/burst-absolute-escape.txt", "")],
    [("out", "../.."), ("out/escaped.txt", "")],
    [("abs", "/tmp"), ("abs/burst-link-escape.txt", "")],
], ids=["dotdot", "absolute", "relative-symlink", "absolute-symlink"])
def test_restore_without_tarfile_data_filter_still_refuses_escaping_members(tmp_path, members):
    """A node's stock Python (3.11.2) has no ``filter=``: the member checks alone guard."""
    raw = _raw_tar(*members)
    dest = tmp_path / "a" / "b" / "o"
    with pytest.raises(SnapshotError, match="unsafe"):
        codearchive.unpack(gzip.compress(raw), hashlib.sha256(raw).hexdigest(), dest,
                           1 << 20, data_filter=False)
    assert not (tmp_path / "a" / "escaped.txt").exists()
    assert not Path("/tmp/burst-absolute-escape.txt").exists()
    assert not Path("/tmp/burst-link-escape.txt").exists()
    assert not any(p.is_symlink() for p in dest.rglob("*"))


def test_restore_without_tarfile_data_filter_restores_the_tree(tmp_path):
    repo = make_repo(tmp_path / "repo")
    captured = codearchive.capture(repo)
    codearchive.unpack(captured.tar_gz, captured.digest, tmp_path / "o", 1 << 20,
                       data_filter=False)
    assert tree(tmp_path / "o") == _expected_tree(repo)

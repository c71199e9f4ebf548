"""The code archive never takes burst stores or what git ignores: run from a folder that
holds earlier runs' stores, the archive took them (their archives too) and grew with every
run, 4 -> 21 -> 66 MB, until it hit the cap and no code was recorded at all."""

from __future__ import annotations

from pathlib import Path

from burst import events
from burst.env import codearchive
from burst.store import LocalStore
from tests.helpers.env_helpers import git, make_repo, write


def _names(captured: codearchive.Captured, tmp_path: Path) -> list[str]:
    return codearchive.unpack(captured.tar_gz, captured.digest, tmp_path / "unpacked", 1 << 24)


def _old_run(store_dir: Path, run_id: str, project: Path) -> None:
    """A store as an earlier run left it: its history and its own code archive."""
    store = LocalStore(store_dir)
    events.record(store, run_id, "start", global_batch=8)
    codearchive.upload(store, run_id, codearchive.capture(project))


def test_nested_stores_and_gitignored_folders_stay_out_of_a_repositorys_archive(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo, "checkpoints/big.bin", "ignored by .gitignore\n")
    _old_run(repo / "experiments" / "runs", "old-run", repo)
    _old_run(repo / "experiments" / "runs", "older-run", repo)
    names = _names(codearchive.capture(repo / "experiments"), tmp_path)
    assert "train.py" in names and "model/net.py" in names
    assert not [n for n in names if n.startswith(("experiments/", "checkpoints/"))]


def test_a_project_outside_git_keeps_its_archive_the_same_however_many_runs_it_holds(
        tmp_path):
    project = tmp_path / "project"
    write(project, "train.py", "x = 1\n")
    write(project, "lib/model.py", "WIDTH = 4\n")
    write(project, ".gitignore", "data/\n")
    write(project, "data/shard-0.bin", "x" * 4096)
    first = codearchive.capture(project)
    _old_run(project / "runs", "first", project)  # its archive lands inside the project
    events.record(LocalStore(project / "lib" / "tier"), "first", "start")
    codearchive.upload(LocalStore(project / "lib" / "tier"), "first", first)
    second = codearchive.capture(project)
    assert second.digest == first.digest
    assert _names(second, tmp_path) == [".gitignore", "lib/model.py", "train.py"]
    assert {"path": "runs/first/", "reason": "a burst store (not archived)"} in second.skipped


def test_a_folder_with_only_one_kind_of_store_file_is_still_archived(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo, "logs/events.jsonl", '{"event": "epoch"}\n')  # a user's own log, not a store
    git(repo, "add", "logs/events.jsonl")
    assert "logs/events.jsonl" in _names(codearchive.capture(repo), tmp_path)

"""Which files are the run's inputs, which travel, and why the others do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from burst.errors import ConfigError
from burst.inputs import hubs, names, selection

SETTINGS = selection.Settings()


def choose(recorded=(), declared=(), settings=SETTINGS, **kwargs):
    kwargs.setdefault("code_root", None)
    kwargs.setdefault("in_archive", set())
    kwargs.setdefault("environment", selection.environment_dirs())
    kwargs.setdefault("hub_list", [])
    return selection.choose(settings, declared, [str(p) for p in recorded], **kwargs)


def shipped(chosen: selection.Selection) -> set[str]:
    return {f for root in chosen.roots for f in root.files}


def test_reads_in_the_python_environment_and_the_system_are_not_inputs():
    chosen = choose([Path(os.__file__).parent / "LICENSE.txt", "/etc/hostname",
                     Path(sys.prefix) / "pyvenv.cfg"])
    assert chosen.roots == [] and chosen.skipped == [] and chosen.refused == []


def test_python_code_read_outside_the_project_is_not_an_input(tmp_path):
    (tmp_path / "helper.py").write_text("x = 1\n")
    assert choose([tmp_path / "helper.py"]).roots == []


def test_package_metadata_and_tool_caches_read_by_the_process_are_not_inputs(tmp_path):
    read = []
    for folder in ("proj/pkg.egg-info", "proj/.pytest_cache/v/cache", "env/x-1.0.dist-info"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "entry").write_text("x\n")
        read.append(tmp_path / folder / "entry")
    assert choose(read).roots == []


def test_a_file_read_outside_the_project_travels_with_its_folder(dataset):
    chosen = choose([dataset / "docs" / "doc0.txt"])
    assert [r.path for r in chosen.roots] == [str(dataset / "docs")]
    assert shipped(chosen) == {str(p) for p in (dataset / "docs").iterdir()}


def test_a_declared_folder_travels_whole(dataset):
    chosen = choose(declared=[str(dataset)])
    assert chosen.roots[0].kind == "dir" and len(shipped(chosen)) == 4


def test_each_input_gets_its_own_variable(dataset):
    chosen = choose([dataset / "docs" / "doc0.txt", dataset / "tokens.bin"])
    assert sorted(r.env for r in chosen.roots) == ["BURST_INPUT_DATA", "BURST_INPUT_DOCS"]


def test_an_object_storage_url_travels_as_a_reference():
    chosen = choose(declared=["s3://bucket/corpus/"])
    assert [(r.path, r.kind, r.files) for r in chosen.roots] == [("s3://bucket/corpus/",
                                                                  "url", [])]


def test_a_declared_path_that_does_not_exist_is_refused(tmp_path):
    chosen = choose(declared=[str(tmp_path / "missing")])
    assert chosen.refused[0]["why"].startswith(names.UNREADABLE)


def test_a_fifo_is_refused_as_a_device(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    chosen = choose(declared=[str(tmp_path / "pipe")])
    assert chosen.refused == [{"path": str(tmp_path / "pipe"), "why": names.DEVICE}]


def test_an_input_over_the_size_limit_is_refused(dataset):
    chosen = choose(declared=[str(dataset)], settings=selection.Settings(max_bytes=10**6))
    assert chosen.roots == [] and chosen.refused[0]["why"].startswith(names.OVER_LIMIT)


def test_an_excluded_pattern_is_left_out(dataset):
    settings = selection.Settings(exclude=(f"{dataset}/docs/*",))
    chosen = choose([dataset / "docs" / "doc0.txt"], settings=settings)
    assert chosen.roots == [] and chosen.skipped[0]["why"] == names.EXCLUDED


def git_project(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("*.pkl\n")
    (root / "config.yaml").write_text("lr: 0.1\n")
    (root / "meta.pkl").write_bytes(b"vocab")
    return root


def test_a_file_the_code_archive_holds_is_not_shipped_again(tmp_path):
    root = git_project(tmp_path / "proj")
    chosen = choose([root / "config.yaml"], code_root=str(root), in_archive={"config.yaml", ".gitignore"})
    assert chosen.roots == []
    assert chosen.skipped == [{"path": str(root / "config.yaml"), "why": names.IN_CODE}]


def test_a_gitignored_file_read_travels_and_the_freeze_says_so(tmp_path):
    root = git_project(tmp_path / "proj")
    chosen = choose([root / "meta.pkl"], code_root=str(root), in_archive={"config.yaml", ".gitignore"},
                    ignored={"meta.pkl": "*.pkl in .gitignore"})
    assert shipped(chosen) == {str(root / "meta.pkl")}  # not its tracked neighbours
    assert chosen.notes == ["meta.pkl is ignored by git (*.pkl in .gitignore), not in the "
                            "code archive: it travels as an input"]


def test_a_gitignored_file_that_cannot_travel_is_a_warning_that_the_node_will_miss_it(
        tmp_path):
    root = git_project(tmp_path / "proj")
    chosen = choose([root / "meta.pkl"], code_root=str(root), in_archive={"config.yaml", ".gitignore"},
                    ignored={"meta.pkl": "*.pkl in .gitignore"},
                    settings=selection.Settings(exclude=("*.pkl",)))
    assert "the node's run will not find it" in chosen.notes[0]
    assert any("meta.pkl" in line and "warning" in line for line in selection.lines(chosen))


def hf_cache(home: Path) -> Path:
    """A Hugging Face hub cache as the hub library lays it out (blob + snapshot link)."""
    repo = home / ".cache" / "huggingface" / "hub" / "models--tiny--net"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_bytes(b"weights")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    (repo / "snapshots" / "c0ffee" / "model.pt").symlink_to("../../blobs/abc123")
    (repo / "blobs" / "other-model").write_bytes(b"not read")
    return repo


def test_hub_cache_files_read_travel_with_the_variable_the_hub_library_reads(tmp_path):
    repo = hf_cache(tmp_path)
    hub_list = hubs.caches({"HOME": str(tmp_path)})
    read = repo / "snapshots" / "c0ffee" / "model.pt"
    chosen = choose([read, repo / "refs" / "main"], hub_list=hub_list)
    (root,) = chosen.roots
    assert (root.kind, root.hub_env, root.path) == ("hub", "HF_HOME",
                                                   str(tmp_path / ".cache" / "huggingface"))
    assert set(root.files) == {str(read), str(repo / "refs" / "main")}  # not the whole cache


def test_a_preferred_hub_mirror_is_forwarded_instead_of_the_cache(tmp_path):
    repo = hf_cache(tmp_path)
    environ = {"HOME": str(tmp_path), "HF_ENDPOINT": "https://hf-mirror.com"}
    chosen = choose([repo / "refs" / "main"], hub_list=hubs.caches(environ), environ=environ,
                    settings=selection.Settings(hub="mirror"))
    assert chosen.roots == [] and chosen.mirrors == {"HF_ENDPOINT": "https://hf-mirror.com"}


def test_settings_come_from_the_config_file_and_the_environment(tmp_path):
    config = {"inputs": {"paths": ["~/data"], "max_bytes": "2GB", "hub": "mirror",
                         "exclude": ["*.tmp"]}}
    s = selection.settings(config, {names.INPUTS_ENV: f"/a{os.pathsep}/b"})
    assert s == selection.Settings(("~/data", "/a", "/b"), 2 * 10**9, True, "mirror",
                                   ("*.tmp",))


def test_a_size_that_is_not_one_is_a_one_line_error():
    with pytest.raises(ConfigError, match="not a size"):
        selection.settings({"inputs": {"max_bytes": "lots"}}, {})


def test_credentials_read_beside_the_data_never_travel(tmp_path, dataset):
    (dataset / "docs" / ".env").write_text("AWS_SECRET_ACCESS_KEY=canary\n")
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "config").write_text("[default]\n")
    chosen = choose([dataset / "docs" / "doc0.txt", aws / "config"])
    assert str(dataset / "docs" / ".env") not in shipped(chosen)
    assert str(aws / "config") not in shipped(chosen)
    assert {s["why"] for s in chosen.skipped} == {names.SECRET}


def test_a_small_file_holding_a_private_key_never_travels(dataset):
    key = dataset / "docs" / "deploy.txt"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "A" * 64 +
                   "\n-----END OPENSSH PRIVATE KEY-----\n")
    assert str(key) not in shipped(choose([dataset / "docs" / "doc0.txt"]))

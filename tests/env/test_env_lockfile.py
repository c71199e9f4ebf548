"""The lockfile: every distribution pinned, where packages came from, stored by its hash."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

import pytest
import torch

from burst.env import lockfile, pkgindex
from burst.env.lockfile import LockfileError, Package
from burst.snapshot.format import FORMAT_VERSION
from burst.store import MemoryStore


def test_freeze_pins_every_installed_distribution(frozen):
    installed = {lockfile.normalize(d.metadata["Name"]): d.version
                 for d in metadata.distributions() if d.metadata["Name"]}
    pinned = {p.name: p.version for p in frozen.packages}
    assert pinned.keys() == installed.keys()
    assert all(pinned[name] == installed[name] or name == "burst-failover" for name in pinned)
    assert frozen.package("torch").requirement() == f"torch=={torch.__version__}"


def test_freeze_records_python_platform_and_the_torch_build(frozen):
    assert frozen.python["version"].count(".") == 2 and frozen.python["abi"].startswith("cp3")
    assert frozen.platform["system"] and frozen.platform["machine"]
    assert frozen.torch["version"] == torch.__version__
    expected = "cpu" if torch.version.cuda is None else frozen.torch["variant"]
    assert frozen.torch["variant"] == expected
    assert frozen.burst["snapshot_format"] == FORMAT_VERSION


def test_lockfile_round_trips_through_json_and_the_store(frozen):
    assert lockfile.loads(frozen.dumps()) == frozen
    store = MemoryStore("lockfile-roundtrip")
    digest = lockfile.save(store, "r", frozen)
    assert digest == frozen.digest
    assert lockfile.load(store, "r", digest) == frozen
    assert lockfile.load(store, "r") == frozen  # the newest one


def test_same_environment_gives_the_same_hash(frozen):
    assert lockfile.build(Path.cwd()).digest == frozen.digest


def test_stored_lockfile_that_does_not_match_its_hash_is_refused(frozen):
    store = MemoryStore("lockfile-corrupt")
    digest = lockfile.save(store, "r", frozen)
    store.put(lockfile.key("r", digest), frozen.dumps().replace(b"torch", b"t0rch"))
    with pytest.raises(LockfileError, match="does not match its hash"):
        lockfile.load(store, "r", digest)


def test_missing_or_foreign_lockfile_is_a_one_line_error():
    with pytest.raises(LockfileError, match="burst freeze r"):
        lockfile.load(MemoryStore("lockfile-none"), "r")
    with pytest.raises(LockfileError, match="unsupported lockfile version 99"):
        lockfile.loads(json.dumps({"version": 99}))
    with pytest.raises(LockfileError, match="not a burst lockfile"):
        lockfile.loads(b"{nope")


def _dist(site: Path, name: str, version: str, direct_url: dict | None = None,
          requires: tuple[str, ...] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_editable_local_vcs_and_url_installs_are_recorded_by_source(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    site = tmp_path / "site"
    _dist(site, "myproj", "0.1", {"url": project.as_uri(), "dir_info": {"editable": True}})
    _dist(site, "elsewhere", "1.0", {"url": "file:///opt/src/elsewhere", "dir_info": {}})
    _dist(site, "gitpkg", "2.0", {"url": "https://bob:tok3n@github.com/o/gitpkg.git",
                                  "vcs_info": {"vcs": "git", "commit_id": "abc123"}})
    _dist(site, "wheelurl", "3.0", {"url": "https://files.example.com/w.whl?token=s3cret",
                                    "archive_info": {}})
    got = {p.name: p for p in lockfile.collect_packages([str(site)], code_root=project)}
    assert got["myproj"] == Package("myproj", "0.1", "editable", project.as_posix(),
                                    installable=False, in_code=".")
    assert got["elsewhere"].installable is False and got["elsewhere"].in_code is None
    assert got["gitpkg"].requirement() == "gitpkg @ git+https://github.com/o/gitpkg.git@abc123"
    assert got["wheelurl"].requirement() == "wheelurl @ https://files.example.com/w.whl"


@pytest.mark.parametrize("source_tree_first", [True, False])
def test_an_installed_distribution_beats_a_source_trees_egg_info(tmp_path, source_tree_first):
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    egg = checkout / "mypkg.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.0.dev0\n")
    _dist(site, "mypkg", "1.2")
    paths = [str(checkout), str(site)] if source_tree_first else [str(site), str(checkout)]
    got = {p.name: p.version for p in lockfile.collect_packages(paths)}
    assert got["mypkg"] == "1.2"


def test_torch_cuda_libraries_are_marked_as_following_the_torch_build(tmp_path):
    site = tmp_path / "site"
    _dist(site, "torch", "2.8.0", requires=("nvidia-cublas-cu12==12.8.4.1; "
                                            "platform_system == 'Linux'", "filelock"))
    _dist(site, "nvidia-cublas-cu12", "12.8.4.1")
    _dist(site, "triton", "3.4.0")
    _dist(site, "nvidia-ml-py", "12.575.51")
    _dist(site, "filelock", "3.18.0")
    coupled = {p.name for p in lockfile.collect_packages([str(site)]) if p.torch_coupled}
    assert coupled == {"nvidia-cublas-cu12", "triton"}


def test_configured_indexes_are_recorded_without_credentials(tmp_path):
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nindex-url = https://me:p4ss@pypi.tuna.tsinghua.edu.cn/simple\n"
                        "extra-index-url = https://mirrors.aliyun.com/pytorch-wheels/cu121\n")
    uv_toml = tmp_path / "uv.toml"
    uv_toml.write_text('[[index]]\nurl = "https://__token__:uvtok@corp.example/simple"\n'
                       "default = true\n")
    env = {"PIP_CONFIG_FILE": str(pip_conf), "UV_CONFIG_FILE": str(uv_toml), "HOME": str(tmp_path),
           "XDG_CONFIG_DIRS": str(tmp_path / "none"),
           "PIP_EXTRA_INDEX_URL": "https://x:envtok@extra.example/simple?k=v",
           "UV_INDEX": "corp=https://u:uvenv@uv.example/simple"}
    indexes = pkgindex.configured_indexes(env)
    urls = {(i.url, i.role) for i in indexes}
    assert {("https://pypi.tuna.tsinghua.edu.cn/simple", "index"),
            ("https://mirrors.aliyun.com/pytorch-wheels/cu121", "extra-index"),
            ("https://corp.example/simple", "index"),
            ("https://extra.example/simple", "extra-index"),
            ("https://uv.example/simple", "extra-index")} <= urls
    assert pkgindex.torch_index_template(indexes) == (
        "https://mirrors.aliyun.com/pytorch-wheels/{variant}")
    assert not any(s in repr(indexes) for s in ("p4ss", "uvtok", "envtok", "uvenv", "k=v"))
    assert all(" " not in i.origin or i.origin.split(" ", 1)[0] in ("env", "pip", "uv")
               for i in indexes)


def test_markers_come_from_the_requiring_distributions_metadata(tmp_path):
    here = platform.machine()
    site = tmp_path / "site"
    _dist(site, "app", "1.0", requires=(f'onlyhere; platform_machine == "{here}"',
                                        'viaextra; extra == "fast" and python_version >= "3"',
                                        'winonly; sys_platform == "win32"', "always"))
    for name in ("onlyhere", "viaextra", "winonly", "always"):
        _dist(site, name, "1.0")
    got = {p.name: p.marker for p in lockfile.collect_packages([str(site)])}
    assert got["onlyhere"] == f'platform_machine == "{here}"'
    assert got["always"] is None and got["app"] is None
    assert got["viaextra"] is None  # the extra was taken; python >= 3 holds everywhere left
    assert got["winonly"] is None  # installed here although not needed: kept everywhere
    other = "aarch64" if here != "aarch64" else "x86_64"
    lock = lockfile.Lockfile(packages=lockfile.collect_packages([str(site)]))
    names = {p.name for p in lock.applicable(lockfile.node_environment("3.11", other))}
    assert names == {"app", "always", "viaextra", "winonly"}


def test_a_windows_only_pin_does_not_apply_on_a_linux_node():
    pin = Package("pywin32", "306", marker='sys_platform == "win32"')
    assert not lockfile.applies(pin, lockfile.node_environment("3.10", "x86_64"))
    assert lockfile.applies(pin, lockfile.node_environment("3.10", "AMD64", "Windows"))


def test_a_lockfile_written_before_markers_loads_and_applies_everywhere(frozen):
    data = frozen.to_json()
    for entry in data["packages"]:
        entry.pop("marker", None)
    old = lockfile.loads(json.dumps(data))
    assert all(p.marker is None for p in old.packages)
    assert old.applicable(lockfile.node_environment("3.10", "aarch64")) == old.packages

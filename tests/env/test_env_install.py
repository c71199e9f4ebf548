"""``burst env install``: a lockfile becomes a working environment on the new node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.contract import ENV_EXTRA_INDEX_URL, ENV_INDEX_URL
from burst.env import freeze
from burst.env import install as envinstall
from burst.env.lockfile import Lockfile, Package
from burst.env.torchvariant import Target
from burst.errors import ConfigError
from burst.store import open_store
from tests.helpers.env_helpers import build_wheel, make_repo, tiny_lockfile, tree

OFFLINE = ["--no-index", "--installer", "pip", "--cpu"]


def _python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def test_install_creates_a_working_environment_without_network(tmp_path):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "burst-tiny-alpha", "1.2.3", "VALUE = 'alpha'\n")
    build_wheel(wheels, "burst-tiny-beta", "0.1.0", "VALUE = 'beta'\n")
    build_wheel(wheels, "burst-tiny-beta", "0.2.0", "VALUE = 'wrong version'\n")
    lock = tiny_lockfile(Package("burst-tiny-alpha", "1.2.3"), Package("burst-tiny-beta", "0.1.0"),
                         Package("myproj", "0.1", "editable", "/src/myproj", installable=False))
    (tmp_path / "lock.json").write_bytes(lock.dumps())
    venv = tmp_path / "venv"
    result = CliRunner().invoke(main, ["env", "install", "--lockfile", str(tmp_path / "lock.json"),
                                       "--venv", str(venv), "--find-links", str(wheels),
                                       *OFFLINE])
    assert result.exit_code == 0, result.output
    assert "0 errors, 0 warnings" in result.output
    done = subprocess.run([_python(venv), "-c", "import burst_tiny_alpha as a, burst_tiny_beta "
                           "as b; print(a.VALUE, b.VALUE)"], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "alpha beta"


def test_install_restores_the_code_archive_of_a_run(tmp_path):
    repo = make_repo(tmp_path / "repo")
    store = open_store(tmp_path / "store")
    frozen = freeze.freeze(store, "r", code_dir=repo, lock=tiny_lockfile())
    out = tmp_path / "node"
    result = CliRunner().invoke(main, ["env", "install", "r", "--store", str(tmp_path / "store"),
                                       "--venv", str(tmp_path / "venv"), "--code-dir", str(out),
                                       *OFFLINE])
    assert result.exit_code == 0, result.output
    assert f"restored {frozen.code_ref['files']} files" in result.output
    restored = tree(out)
    assert restored["train.py"][1] == b"print('v2: uncommitted')\n"
    assert ".env" not in restored and "id_rsa" not in restored


def test_failed_install_is_a_one_line_error(tmp_path):
    lock = tiny_lockfile(Package("burst-tiny-absent", "9.9"))
    (tmp_path / "lock.json").write_bytes(lock.dumps())
    result = CliRunner().invoke(main, ["env", "install", "--lockfile", str(tmp_path / "lock.json"),
                                       "--venv", str(tmp_path / "v"), "--find-links",
                                       str(tmp_path), *OFFLINE])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith(
        "Error: installing 1 pinned distributions failed (exit 1)")


def _gpu_lock() -> Lockfile:
    return Lockfile(
        packages=[Package("numpy", "2.1.0"), Package("torch", "2.8.0+cpu"),
                  Package("torchvision", "0.23.0+cpu"),
                  Package("nvidia-cublas-cu12", "12.6.4.1", torch_coupled=True),
                  Package("nvidia-ml-py", "12.575.51")],
        python={"version": "3.11.7"}, torch={"version": "2.8.0+cpu", "variant": "cpu"},
        indexes=[{"url": "https://pypi.tuna.tsinghua.edu.cn/simple", "role": "index",
                  "origin": "env PIP_INDEX_URL"}])


def _plan(lock: Lockfile, target: Target, env: dict | None = None, **options):
    return envinstall.make_plan(lock, target, envinstall.Options(venv=None, installer="pip",
                                                                 **options), env or {})


def test_cpu_lockfile_on_a_gpu_node_installs_a_cuda_build():
    plan = _plan(_gpu_lock(), Target("cuda", "NVIDIA H100 80GB HBM3", (9, 0), (12, 8)))
    assert plan.requirements == ["numpy==2.1.0", "torch==2.8.0+cu128",
                                 "torchvision==0.23.0+cu128", "nvidia-ml-py==12.575.51"]
    assert plan.index_args == ["--index-url", "https://pypi.tuna.tsinghua.edu.cn/simple",
                               "--extra-index-url", "https://download.pytorch.org/whl/cu128"]
    assert {"name": "nvidia-cublas-cu12", "reason": "chosen by the new torch build"} in plan.skipped


def test_node_with_its_own_index_keeps_it_and_torch_index_can_be_mirrored():
    plan = _plan(_gpu_lock(), Target("cuda", "H100", (9, 0), (12, 8)),
                 {"PIP_INDEX_URL": "https://user:tok@corp.example/simple", "HOME": "/nonexistent",
                  "XDG_CONFIG_DIRS": "/nonexistent"},
                 torch_index="https://mirrors.aliyun.com/pytorch-wheels/{variant}")
    assert plan.index_args == ["--extra-index-url",
                               "https://mirrors.aliyun.com/pytorch-wheels/cu128"]
    assert any("own index" in note for note in plan.notes)


def test_uv_resolves_pins_across_indexes(monkeypatch):
    monkeypatch.setattr(envinstall.shutil, "which", lambda name: f"/usr/bin/{name}")
    plan = envinstall.make_plan(_gpu_lock(), Target("cpu"),
                                envinstall.Options(venv=None, installer="auto"), {})
    assert plan.installer == "uv"
    assert plan.index_args[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert plan.install_command("r.txt")[:3] == ["uv", "pip", "install"]


def test_gpu_node_that_nvml_cannot_read_is_an_error_not_a_cpu_install(monkeypatch):
    monkeypatch.setattr(envinstall.envfacts, "detect_gpu", lambda: None)
    monkeypatch.setattr(envinstall.envfacts, "nvidia_device_present", lambda: True)
    with pytest.raises(ConfigError, match="NVML cannot read it"):
        envinstall.detect_target()


def test_dry_run_prints_the_plan_and_installs_nothing(tmp_path):
    (tmp_path / "lock.json").write_bytes(_gpu_lock().dumps())
    result = CliRunner().invoke(main, ["env", "install", "--lockfile", str(tmp_path / "lock.json"),
                                       "--venv", str(tmp_path / "v"), "--gpu", "NVIDIA B200",
                                       "--installer", "pip", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["torch"]["variant"] == "cu129" and "torch==2.8.0+cu129" in plan["requirements"]
    assert not (tmp_path / "v").exists()


def test_conflicting_torch_flags_are_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["env", "install", "--lockfile", "x", "--cpu", "--rocm"])
    assert result.exit_code == 2 and result.output.startswith("Error: give at most one")


def test_torch_already_in_the_venv_at_the_planned_build_is_not_installed_again(tmp_path):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "torch", "2.8.0+cpu", "VALUE = 'bootstrap put me here'\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", _python(venv), "install", "-q",
                    "--no-index", "--find-links", str(wheels), "torch==2.8.0+cpu"], check=True)
    lock = tiny_lockfile(Package("torch", "2.8.0+cpu"), Package("burst-tiny-alpha", "1.2.3"))
    lock.torch = {"version": "2.8.0+cpu", "variant": "cpu"}
    plan = envinstall.make_plan(lock, Target("cpu"),
                                envinstall.Options(venv=venv, installer="pip"), {})
    assert plan.present == ["torch==2.8.0+cpu"]
    assert plan.requirements == ["burst-tiny-alpha==1.2.3"]


def test_a_pin_only_windows_needs_is_skipped_on_this_node():
    lock = tiny_lockfile(Package("burst-tiny-alpha", "1.2.3"),
                         Package("pywin32", "306", marker='sys_platform == "win32"'))
    plan = _plan(lock, Target("cpu"))
    assert plan.requirements == ["burst-tiny-alpha==1.2.3"]
    assert plan.skipped == [{"name": "pywin32",
                             "reason": 'not needed here (marker sys_platform == "win32")'}]


def test_a_forwarded_mirror_serves_what_the_wheelhouse_lacks():
    plan = _plan(_gpu_lock(), Target("cpu"), {ENV_INDEX_URL: "https://mirror.example/simple",
                                              ENV_EXTRA_INDEX_URL: "https://x.example/s"})
    assert plan.index_args[:4] == ["--index-url", "https://mirror.example/simple",
                                   "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert "https://x.example/s" in plan.index_args

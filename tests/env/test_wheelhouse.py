"""The wheelhouse: a run's pinned distributions as wheels in the store, installable on a
node that reaches no package index.

A small real project (pyproject + module, depending on a wheel from a local find-links
directory) is installed editable into a throwaway venv and frozen; the wheelhouse is built
with every index pointing at a dead port on 127.0.0.1, uploaded to a real S3 server, and
installed from into a fresh venv with ``--no-index``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from burst.env import install as envinstall
from burst.env import lockfile, wheelhouse
from burst.env.lockfile import Package
from burst.env.torchvariant import Target as Card
from burst.store import open_store
from tests.env_helpers import build_wheel, tiny_lockfile
from tests.store_servers import aws_env, free_port

APP, DEP = "burst-wh-app", "burst-wh-dep"


def _offline_pip(monkeypatch: pytest.MonkeyPatch, links: Path, cache: Path) -> None:
    """pip as on a machine whose only source is ``links``: no config, a dead index."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv(wheelhouse.CACHE_ENV, str(cache))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict:
    """A throwaway venv holding an editable project and its one dependency, frozen."""
    root = tmp_path_factory.mktemp("wheelhouse")
    links = root / "links"
    build_wheel(links, DEP, "1.0.0", "VALUE = 'dep'\n")
    app = root / "app"
    (app / "burst_wh_app").mkdir(parents=True)
    (app / "burst_wh_app" / "__init__.py").write_text(
        "from burst_wh_dep import VALUE as DEP\nVALUE = 'app:' + DEP\n")
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{APP}"\nversion = "0.1.0"\ndependencies = ["{DEP}==1.0.0"]\n'
        '[tool.setuptools]\npackages = ["burst_wh_app"]\n')
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--prefix", str(venv),
                    "--no-index", "--find-links", str(links), "--no-build-isolation", "-e",
                    str(app)], check=True, env=env)  # built by this setuptools: offline
    site = next((venv / "lib").glob("python3.*/site-packages"))
    lock = lockfile.build(app, paths=[str(site)], with_torch=False, with_gpu=False)
    return {"root": root, "links": links, "app": app, "lock": lock}


@pytest.fixture(scope="module")
def stored(project, moto_s3, tmp_path_factory) -> dict:
    """The project's wheelhouse built offline and uploaded to a real S3 server once."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        aws_env(monkeypatch)
        _offline_pip(monkeypatch, project["links"], project["root"] / "cache")
        store = CountingStore(open_store(moto_s3.url(), **moto_s3.options()))
        target = wheelhouse.target_for(project["lock"], policy="no-torch")
        first = wheelhouse.ensure(store, "run-a", project["lock"], target)
        puts_after_first = list(store.puts)
        again = wheelhouse.ensure(store, "run-a", project["lock"], target)
        other_run = wheelhouse.ensure(store, "run-b", project["lock"], target)
        yield {"store": store, "target": target, "first": first, "again": again,
               "other_run": other_run, "puts_after_first": puts_after_first}


class CountingStore:
    """The real S3 store, with every write it is asked for counted."""

    def __init__(self, store):
        self.store, self.url, self.puts = store, store.url, []

    def put(self, key, data):
        self.puts.append(key)
        self.store.put(key, data)

    def put_if_absent(self, key, data):
        self.puts.append(key)
        return self.store.put_if_absent(key, data)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.e2e
def test_the_index_lists_a_wheel_for_every_applicable_pin(project, stored):
    index = wheelhouse.load_index(stored["store"], "run-a", project["lock"].digest)
    roles = {w["name"]: w["role"] for w in index["wheels"]}
    pinned = {p.name for p in project["lock"].packages}
    assert pinned <= roles.keys(), index["missing"]
    assert roles[APP] == "local" and roles[DEP] == "dependency"
    assert roles["pip"] == "tool" and roles["burst-failover"] == "burst"
    assert index["missing"] == []
    assert index["target"]["policy"] == "no-torch" and "manylinux_2_17_x86_64" in \
        index["target"]["platforms"]
    for w in index["wheels"]:
        assert w["key"] == f"wheels/{w['sha256']}/{w['file']}"
        assert stored["store"].size(w["key"]) == w["size"]


@pytest.mark.e2e
def test_a_second_freeze_uploads_nothing(stored):
    assert stored["first"].wheels_sent >= 4
    assert stored["again"] is None
    assert stored["store"].puts[:len(stored["puts_after_first"])] == stored["puts_after_first"]


@pytest.mark.e2e
def test_another_run_in_the_same_store_uploads_no_wheel_again(project, stored):
    first, other = stored["first"], stored["other_run"]
    later = stored["store"].puts[len(stored["puts_after_first"]):]
    assert later[-1] == wheelhouse.index_key("run-b", project["lock"].digest)
    # burst's own wheel is rebuilt from the live source: new only if that source changed
    assert not set(later) & set(stored["puts_after_first"])
    assert other.wheels_sent <= 1 and other.wheels_present >= len(first.index["wheels"]) - 1


@pytest.mark.e2e
def test_a_fresh_venv_installs_from_the_downloaded_wheelhouse_with_no_index(
        project, stored, tmp_path, monkeypatch):
    aws_env(monkeypatch)
    _offline_pip(monkeypatch, tmp_path / "no-links", tmp_path / "cache")
    house = tmp_path / "house"
    index = wheelhouse.download(stored["store"], "run-a", project["lock"].digest, house)
    assert sorted(p.name for p in house.glob("*.whl")) == sorted(w["file"]
                                                                 for w in index["wheels"])
    venv = tmp_path / "node-venv"
    options = envinstall.Options(venv=venv, installer="pip", no_index=True, wheelhouse=house)
    plan = envinstall.make_plan(project["lock"], Card("cpu"), options)
    assert plan.requirements == [] and f"{APP}==0.1.0" in plan.from_wheelhouse
    envinstall.execute(plan, echo=lambda _line: None)
    done = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import burst_wh_app; print(burst_wh_app.VALUE)"],
                          capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "app:dep", done.stderr


def test_a_windows_only_pin_is_neither_stored_nor_installed():
    lock = tiny_lockfile(Package(DEP, "1.0.0"),
                         Package("pywin32", "306", marker='sys_platform == "win32"'))
    pins, left = wheelhouse.plan(lock, wheelhouse.target_for(lock, policy="no-torch"))
    assert {p.name for p in pins} >= {DEP} and "pywin32" not in {p.name for p in pins}
    assert left == []
    plan = envinstall.make_plan(lock, Card("cpu"), envinstall.Options(venv=None,
                                                                      installer="pip"), {})
    assert plan.requirements == [f"{DEP}==1.0.0"]
    assert plan.skipped[0]["name"] == "pywin32"


def test_no_torch_policy_leaves_torch_and_its_cuda_libraries_to_a_mirror():
    lock = tiny_lockfile(Package("torch", "2.8.0+cu128"),
                         Package("nvidia-cublas-cu12", "12.8.4.1", torch_coupled=True),
                         Package("numpy", "2.1.0"))
    lock.torch = {"version": "2.8.0+cu128", "variant": "cu128"}
    target = wheelhouse.target_for(lock, policy="no-torch")
    pins, left = wheelhouse.plan(lock, target)
    assert target.torch_variant == "cu128"
    assert {m["name"] for m in left} == {"torch", "nvidia-cublas-cu12"}
    assert "numpy" in {p.name for p in pins}


def test_a_cpu_lock_stores_the_cuda_build_a_cloud_card_needs():
    lock = tiny_lockfile(Package("torch", "2.8.0+cpu"),
                         Package("nvidia-cublas-cu12", "12.6.4.1", torch_coupled=True))
    lock.torch = {"version": "2.8.0+cpu", "variant": "cpu"}
    target = wheelhouse.target_for(lock, policy="all")
    pins, _ = wheelhouse.plan(lock, target)
    torch = next(p for p in pins if p.name == "torch")
    assert target.torch_variant.startswith("cu")  # the newest CUDA 12 build of 2.8
    assert torch.requirement == f"torch==2.8.0+{target.torch_variant}"
    assert "nvidia-cublas-cu12" not in {p.name for p in pins}  # the new build brings its own


def test_an_aarch64_node_gets_aarch64_wheels_only():
    target = wheelhouse.Target("3.10", "aarch64")
    assert all(p.endswith("_aarch64") for p in target.platforms)
    assert not any(t.platform.endswith("x86_64") for t in target.tags())

"""The wheelhouse: a run's pinned distributions as wheels in the store, installable on a
node that reaches no package index.

A small real project (pyproject + module, depending on a wheel from a local find-links
directory) is installed editable into a throwaway venv and frozen; the wheelhouse is built
with every index pointing at a dead port on 127.0.0.1, uploaded to a real S3 server, and
installed from into a fresh venv with ``--no-index``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from burst.env import install as envinstall
from burst.env import lockfile, wheelhouse
from burst.env.lockfile import Package
from burst.env.torchvariant import Target as Card
from burst.store import MemoryStore, open_store
from tests.helpers.env_helpers import build_wheel, tiny_lockfile
from tests.helpers.store_servers import aws_env, free_port

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


# -- repacking what is installed, when no index is reachable ------------------------------

FIT, FOREIGN = "burst-wh-fit", "burst-wh-foreign"
PY_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def _platlib_wheel(directory: Path, name: str, tag: str) -> Path:
    """A platlib wheel (``Root-Is-Purelib: false``, tagged ``tag``) with a package, a
    console script and a data file, written by hand."""
    module, version = name.replace("-", "_"), "2.0.0"
    info, data = f"{module}-{version}.dist-info", f"{module}-{version}.data"
    files = {
        f"{module}/__init__.py": b"VALUE = 'repacked'\ndef main():\n    print(VALUE)\n",
        f"{data}/data/share/{module}/note.txt": b"data beside the package\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: burst-tests\nRoot-Is-Purelib: false\n"
                         f"Tag: {tag}\n".encode(),
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {module}:main\n".encode(),
    }
    record = [f"{rel},sha256={_b64sha(body)},{len(body)}" for rel, body in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for rel, body in files.items():
            wheel.writestr(rel, body)
    return path


def _b64sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _no_index_pip(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """pip as on a machine with no index at all and nothing to find wheels in."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(wheelhouse.CACHE_ENV, str(cache))


@pytest.fixture(scope="module")
def repacked(tmp_path_factory) -> dict:
    """An environment holding a platlib distribution built for this machine (installed into
    a venv) and one built for macOS arm64 (installed with --target), frozen, and its
    wheelhouse built with no index: the first is repacked, the second cannot be."""
    if platform.machine() not in wheelhouse.MACHINES:
        pytest.skip("a wheelhouse targets Linux x86_64 or aarch64 nodes")
    root = tmp_path_factory.mktemp("repack")
    links, venv, foreign = root / "links", root / "venv", root / "foreign"
    _platlib_wheel(links, FIT, f"{PY_TAG}-{PY_TAG}-manylinux_2_17_{platform.machine()}")
    _platlib_wheel(links, FOREIGN, f"{PY_TAG}-{PY_TAG}-macosx_11_0_arm64")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links",
           str(links)]
    subprocess.run([*pip, "--prefix", str(venv), FIT], check=True, env=env)
    subprocess.run([*pip, "--target", str(foreign), "--platform", "macosx_11_0_arm64",
                    "--only-binary=:all:", FOREIGN], check=True, env=env)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    lock = tiny_lockfile(Package(FIT, "2.0.0"), Package(FOREIGN, "2.0.0"))
    target = wheelhouse.target_for(lock, machine=platform.machine(), policy="no-torch")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _no_index_pip(monkeypatch, root / "cache")
        house = wheelhouse.build(lock, target, paths=[str(site), str(foreign)])
    return {"root": root, "house": house, "index": house.index()}


def test_an_installed_distribution_is_repacked_and_a_fresh_venv_installs_it_offline(
        repacked, tmp_path):
    wheel = next(w for w in repacked["house"].wheels if w.name == FIT)
    assert wheel.repacked and wheel.file.endswith(f"-{PY_TAG}-{PY_TAG}-manylinux_2_17_"
                                                  f"{platform.machine()}.whl")
    assert {"name": FIT, "repacked": True} in [{k: w[k] for k in ("name", "repacked")}
                                                for w in repacked["index"]["wheels"]]
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-index", str(wheel.path)], check=True,
                   env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    done = subprocess.run([str(venv / "bin" / FIT)], capture_output=True, text=True,
                          check=False)  # the console script, written again by pip
    assert done.stdout.strip() == "repacked", done.stderr
    module = FIT.replace("-", "_")
    assert (venv / "share" / module / "note.txt").read_text() == "data beside the package\n"


def test_a_repacked_wheel_records_the_sha256_of_every_file_it_holds(repacked):
    wheel = next(w for w in repacked["house"].wheels if w.name == FIT)
    with zipfile.ZipFile(wheel.path) as archive:
        names = set(archive.namelist())
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = {row[0]: row[1] for row in csv.reader(
            io.StringIO(archive.read(record_name).decode()))}
        assert set(rows) == names
        for name in names - {record_name}:
            assert rows[name] == f"sha256={_b64sha(archive.read(name))}", name
    assert not any(n.endswith(("INSTALLER", "REQUESTED", "direct_url.json")) for n in names)


def test_an_installed_platlib_distribution_for_another_platform_is_missing_not_repacked(
        repacked):
    assert FOREIGN not in {w.name for w in repacked["house"].wheels}
    gap = next(m for m in repacked["index"]["missing"] if m["name"] == FOREIGN)
    assert "macosx_11_0_arm64" in gap["why"] and "does not run on the node" in gap["why"]
    assert not list((repacked["root"] / "cache" / "repacked").glob(
        f"*/{FOREIGN.replace('-', '_')}-*.whl"))


def test_a_resumed_nodes_lockfile_with_the_same_pins_reuses_the_runs_wheelhouse(
        tmp_path, monkeypatch):
    """The node's Python is another patch release: a new lockfile, the same pins."""
    _no_index_pip(monkeypatch, tmp_path / "cache")
    store = MemoryStore()
    here = tiny_lockfile(Package(DEP, "1.0.0"), Package("torch", "2.8.0+cpu"))
    node = tiny_lockfile(*here.packages)
    node.python = {**here.python, "version": here.python["version"] + ".9"}
    assert node.digest != here.digest
    wheel = build_wheel(tmp_path / "links", DEP, "1.0.0", "VALUE = 1\n")
    target = wheelhouse.target_for(here, policy="all", torch_variant="cpu")
    house = wheelhouse.Wheelhouse(target, [wheelhouse.Wheel(
        DEP, "1.0.0", wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest(),
        wheel.stat().st_size, "dependency", wheel)])
    lockfile.save(store, "run", here)
    first = wheelhouse.upload(store, "run", here.digest, house)
    node_target = wheelhouse.target_for(node, policy="all", torch_variant="cu128")
    again = wheelhouse.ensure(store, "run", node, node_target)
    assert again is not None and again.wheels_sent == 0 and again.index == first.index
    assert wheelhouse.load_index(store, "run", node.digest) == first.index

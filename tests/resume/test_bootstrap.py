"""The node bootstrap (``burst/node/bootstrap.py``) on a bare interpreter.

It runs as the task runs it: a copy of the file, outside the repository, under the
system's ``/usr/bin/python3`` in a clean environment (no pip configuration, pip's index at a
dead port on 127.0.0.1), against a store holding a small hand-made wheelhouse in the
contract's layout: a stand-in for burst's wheel (``burst-failover``, with a ``burst``
console script) that depends on a second tiny wheel, both built with ``pip wheel``. The
stores are a directory (``file://``), SeaweedFS over TLS (it checks SigV4 signatures) and
OpenSSH's sftp.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from burst.node import bootstrap
from burst.store import open_store
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, aws_env, free_port

SYSTEM_PYTHON = "/usr/bin/python3"
SOURCE = Path(bootstrap.__file__)
DIGEST = "ab" * 32
RUN = "run"

pytestmark = pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="no /usr/bin/python3")


def system_version() -> str:
    return bootstrap.python_version_of(SYSTEM_PYTHON) or "?"


def build_wheel(root: Path, name: str, module: str, body: str, *, deps: list[str] = (),
                scripts: dict[str, str] | None = None) -> Path:
    """``pip wheel`` of a one-module project (offline: no build isolation, no index)."""
    project = root / f"src-{module}"
    project.mkdir()
    (project / f"{module}.py").write_text(body)
    toml = (f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
            f'"setuptools.build_meta"\n[project]\nname = "{name}"\nversion = "0.0.1"\n'
            f"dependencies = {json.dumps(list(deps))}\n[tool.setuptools]\n"
            f'py-modules = ["{module}"]\n')
    if scripts:
        toml += "[project.scripts]\n" + "".join(f'{k} = "{v}"\n' for k, v in scripts.items())
    (project / "pyproject.toml").write_text(toml)
    out = root / "built"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(out), str(project)],
                   check=True, capture_output=True)
    return next(out.glob(f"{name.replace('-', '_')}-*.whl"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> list[tuple[Path, str]]:
    """(wheel, role): burst's stand-in and its dependency."""
    root = tmp_path_factory.mktemp("wheels")
    dep = build_wheel(root, "tinydep", "tinydep", "VALUE = 42\n")
    burst = build_wheel(root, "burst-failover", "fakeburst",
                        "import tinydep\n\ndef main():\n    print('burst', tinydep.VALUE)\n",
                        deps=["tinydep"], scripts={"burst": "fakeburst:main"})
    return [(burst, "burst"), (dep, "dependency")]


def entry(path: Path, role: str) -> dict:
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    name, version = path.name.split("-")[:2]
    return {"name": name.replace("_", "-"), "version": version, "file": path.name,
            "sha256": sha, "size": len(data), "key": f"wheels/{sha}/{path.name}", "role": role}


def publish(url: str, files: list[tuple[Path, str]], *, corrupt: str | None = None,
            python: str | None = None, **settings: str) -> dict:
    """Put the wheels and the index (the contract's format) into the store at ``url``."""
    store = open_store(url, **settings)
    entries = []
    for path, role in files:
        item = entry(path, role)
        store.put(item["key"], path.read_bytes())
        if item["file"] == corrupt:
            item["sha256"] = hashlib.sha256(b"something else").hexdigest()
        entries.append(item)
    index = {"format": 1, "target": {"python": python or system_version(), "platforms": [],
                                     "machine": os.uname().machine, "torch_variant": "cpu",
                                     "policy": "all"},
             "wheels": entries, "missing": []}
    store.put(bootstrap.index_key(RUN, DIGEST), json.dumps(index).encode())
    return index


def run_bootstrap(tmp_path: Path, store_url: str, **extra: str) -> subprocess.CompletedProcess:
    """The bootstrap as the task runs it: a copy, the system python, a clean environment."""
    script = tmp_path / "bootstrap.py"
    shutil.copy(SOURCE, script)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1",
           "PIP_INDEX_URL": f"http://127.0.0.1:{free_port()}/simple",
           "BURST_RUN_ID": RUN, "BURST_STORE": store_url, "BURST_LOCKFILE_DIGEST": DIGEST,
           "BURST_PYTHON": system_version(), "BURST_NODE_DIR": str(tmp_path / "node"), **extra}
    return subprocess.run([SYSTEM_PYTHON, str(script)], cwd=home, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def assert_installed(tmp_path: Path) -> None:
    venv = tmp_path / "node" / "venv"
    done = subprocess.run([str(venv / "bin" / "burst")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "burst 42", done.stderr
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True, check=False)
    assert pip.returncode == 0, "the venv keeps a pip for burst node setup"


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


# -- file:// ----------------------------------------------------------------------------------


def test_a_file_store_wheelhouse_ends_in_a_venv_where_burst_runs(tmp_path, wheels):
    url = f"file://{tmp_path / 'store'}"
    publish(url, wheels)
    done = run_bootstrap(tmp_path, url)
    assert done.returncode == 0, done.stderr
    assert "each matching its sha256" in done.stderr
    assert_installed(tmp_path)


def test_a_second_run_reuses_the_wheels_and_the_venv(tmp_path, wheels):
    url = str(tmp_path / "store")  # a plain path is a store too
    publish(url, wheels)
    assert run_bootstrap(tmp_path, url).returncode == 0
    again = run_bootstrap(tmp_path, url)
    assert again.returncode == 0, again.stderr
    assert "0.0 MB fetched, 2 already there" in again.stderr
    assert_installed(tmp_path)


@pytest.mark.skipif(not list(Path("/usr/share/python-wheels").glob("pip-*.whl")),
                    reason="no pip wheel on this machine to stand in for the wheelhouse's")
def test_without_ensurepip_pip_runs_from_its_wheel_in_the_wheelhouse(tmp_path, wheels):
    pip = sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))[-1]
    url = f"file://{tmp_path / 'store'}"
    publish(url, [*wheels, (pip, "tool")])
    done = run_bootstrap(tmp_path, url, BURST_BOOTSTRAP_PIP="wheel")
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)


def test_a_wheel_with_the_wrong_sha256_fails_in_one_line(tmp_path, wheels):
    url = f"file://{tmp_path / 'store'}"
    publish(url, wheels, corrupt=wheels[1][0].name)
    done = run_bootstrap(tmp_path, url)
    assert done.returncode == 1
    assert f"wheel {wheels[1][0].name} does not match its sha256" in one_line(done)
    assert not (tmp_path / "node" / "venv").exists()
    assert not list((tmp_path / "node" / "wheelhouse").glob("tinydep*"))


def test_a_python_the_node_lacks_fails_in_one_line_before_any_download(tmp_path, wheels):
    url = f"file://{tmp_path / 'store'}"
    publish(url, wheels, python="3.99")
    done = run_bootstrap(tmp_path, url, BURST_PYTHON="3.99")
    assert done.returncode == 2
    assert "Python 3.99 and this node has none" in one_line(done)
    assert "the store holds no standalone Python 3.99 and no uv" in one_line(done)
    assert not (tmp_path / "node").exists()


def test_a_store_without_the_index_names_the_lockfile(tmp_path):
    done = run_bootstrap(tmp_path, f"file://{tmp_path / 'empty'}")
    assert done.returncode == 1
    assert f"no wheelhouse for lockfile {DIGEST[:12]}" in one_line(done)


def test_an_unsupported_store_names_what_is_supported(tmp_path):
    done = run_bootstrap(tmp_path, "gs://bucket/runs")
    assert done.returncode == 2
    assert "it reads file://, s3://" in one_line(done)


# -- S3 (SeaweedFS checks every signature) ----------------------------------------------------


def seaweed_env(seaweed) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "BURST_ENDPOINT_URL": seaweed.endpoint, "BURST_CA_BUNDLE": seaweed.ca_bundle,
            "BURST_ADDRESSING_STYLE": "path", "BURST_REGION": "us-east-1"}


@pytest.fixture
def s3_store(seaweed, monkeypatch):
    aws_env(monkeypatch)
    for name, value in seaweed_env(seaweed).items():
        monkeypatch.setenv(name, value)
    return seaweed.url()


def test_an_s3_wheelhouse_is_fetched_with_signed_requests(tmp_path, wheels, seaweed, s3_store):
    publish(s3_store, wheels)
    done = run_bootstrap(tmp_path, s3_store, **seaweed_env(seaweed))
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)


def test_the_s3_server_refuses_a_bad_signature(tmp_path, wheels, seaweed, s3_store):
    publish(s3_store, wheels)
    env = {**seaweed_env(seaweed), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    done = run_bootstrap(tmp_path, s3_store, **env)
    assert done.returncode == 1
    line = one_line(done)
    assert "answered 403 SignatureDoesNotMatch" in line and "not-the-secret" not in line


def test_the_signer_agrees_with_botocore():
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = "http://127.0.0.1:9000/bucket/runs/a%20b/wheels/x~y/torch-2.4.0%2Bcpu.whl?x-id=GetObject"
    for token in (None, "session-token"):
        request = AWSRequest(method="GET", url=url, headers={})
        S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/key", token), "s3",
                    "cn-beijing").add_auth(request)
        when = datetime.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
        ours = bootstrap.sigv4_headers("GET", url, "cn-beijing", "AKIDEXAMPLE", "secret/key",
                                       token, now=when)
        assert ours["authorization"] == request.headers["Authorization"]
        assert ours["x-amz-content-sha256"] == request.headers["X-Amz-Content-SHA256"]


# -- sftp:// through OpenSSH ------------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("sftp"), reason="no OpenSSH sftp client")
def test_an_sftp_wheelhouse_is_fetched_with_the_system_client(tmp_path, wheels, sshd):
    url = sshd.url()
    publish(url, wheels, ssh_config=str(sshd.config))
    done = run_bootstrap(tmp_path, url, BURST_SSH_CONFIG=str(sshd.config),
                         BURST_KNOWN_HOSTS=str(sshd.known_hosts))
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)


# -- the task's shell part: before and around the bootstrap -----------------------------------


def rendered_setup() -> str:
    """The setup of a real rendered task, up to (not including) ``burst node setup``."""
    from burst.launch.task import NodeSoftware, TaskSpec, render
    from burst.plan.cards import builtin
    from burst.plan.planner import Plan, Target
    from burst.plan.regions import place

    target = Target(builtin().get("A100"), 1, 1, place("aws/us-east-1"), False)
    plan = Plan(target, 16, 8, 2, "bf16", False, True, None, 1, True, (8, 4))
    spec = TaskSpec(RUN, 4, "oom", "burst-boot", [plan], ["python", "train.py"],
                    {"BURST_RUN_ID": RUN, "BURST_STORE": "s3://b/p"}, (),
                    NodeSoftware(None, "burst-failover==0.1"))
    setup = render(spec).setup
    return setup[:setup.rindex("burst_retry ")]


OLD_PYTHON = Path("/root/.pyenv/versions/3.6.15/bin/python3.6")


@pytest.mark.skipif(not OLD_PYTHON.exists(), reason="no Python 3.6 on this machine (pyenv)")
def test_a_node_whose_python3_is_3_6_gets_one_line_not_a_syntax_error(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(OLD_PYTHON)  # Alibaba Cloud Linux 3, RHEL 8
    for tool in ("bash", "cat", "mkdir", "head", "sleep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    parsed = subprocess.run([str(OLD_PYTHON), str(SOURCE)], capture_output=True, text=True,
                            check=False)
    assert "SyntaxError" in parsed.stderr  # what the node would have said without the check
    done = subprocess.run(["bash", "-c", rendered_setup()], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, check=False)
    assert done.returncode == 2
    line = one_line(done)
    assert "this node's python3 is Python 3.6.15" in line and "3.7 or newer" in line
    assert not (tmp_path / "burst-node" / "bootstrap.py").exists()


def test_one_flaky_get_in_setup_is_retried_in_place(tmp_path, wheels, seaweed, s3_store):
    from tests.helpers.fault_proxy import FaultProxy, start

    publish(s3_store, wheels)
    proxy = FaultProxy(seaweed.endpoint, seaweed.ca_bundle)
    flaky = proxy.add("503", "GET", r"/env/wheelhouse-[0-9a-f]+\.json", times=1)
    server, endpoint = start(proxy)
    env = {**seaweed_env(seaweed), "BURST_ENDPOINT_URL": endpoint, "BURST_CA_BUNDLE": "",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BURST_RUN_ID": RUN,
           "BURST_STORE": s3_store, "BURST_LOCKFILE_DIGEST": DIGEST,
           "BURST_PYTHON": system_version(), "BURST_NODE_DIR": str(tmp_path / "node"),
           "PIP_CONFIG_FILE": os.devnull, "BURST_SETUP_BACKOFF": "1"}
    try:
        done = subprocess.run(["bash", "-c", rendered_setup()], capture_output=True, text=True,
                              env=env, timeout=300, check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert flaky.fired == 1
    assert "answered 503" in done.stderr and "attempt 1 of 3; retrying in 1s" in done.stderr
    assert_installed(tmp_path)


def test_a_setup_that_keeps_failing_ends_with_its_own_code(tmp_path):
    from burst.contract import Exit

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BURST_RUN_ID": RUN,
           "BURST_STORE": f"file://{tmp_path / 'empty'}", "BURST_LOCKFILE_DIGEST": DIGEST,
           "BURST_PYTHON": system_version(), "BURST_SETUP_BACKOFF": "0"}
    done = subprocess.run(["bash", "-c", rendered_setup()], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == Exit.SETUP_FAILED
    assert done.stderr.count("no wheelhouse for lockfile") == 3
    assert "setup failed 3 times (last exit 1)" in done.stderr


# -- a node without the lock's Python -----------------------------------------------------------


def shipped_entry(store_url: str, archive: Path, python: str = "3.11") -> dict:
    """Put ``archive`` into the store as a shipped interpreter; its index entry."""
    data = archive.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    key = f"python/{sha}/{archive.name}"
    open_store(store_url).put(key, data)
    return {"file": archive.name, "key": key, "sha256": sha, "size": len(data),
            "python": python, "version": f"{python}.0", "executable": f"bin/python{python}"}


def tar_with(path: Path, members: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_shipped_interpreter_that_does_not_match_its_hash_is_refused(tmp_path):
    url = f"file://{tmp_path / 'store'}"
    entry = shipped_entry(url, tar_with(tmp_path / "cpython.tar.gz",
                                        {"python/bin/python3.11": b"#!/bin/sh\n"}))
    entry["sha256"] = hashlib.sha256(b"another build").hexdigest()
    source = bootstrap.open_source(url, {})
    with pytest.raises(bootstrap.BootstrapError, match="does not match its sha256"):
        bootstrap.unpack_interpreter(source, entry, str(tmp_path / "node"))
    assert not list((tmp_path / "node").glob("python/*"))


def test_a_shipped_interpreter_cannot_write_outside_the_node(tmp_path):
    url = f"file://{tmp_path / 'store'}"
    entry = shipped_entry(url, tar_with(tmp_path / "cpython.tar.gz",
                                        {"python/../../escaped": b"x"}))
    source = bootstrap.open_source(url, {})
    with pytest.raises(bootstrap.BootstrapError, match="unsafe entry"):
        bootstrap.unpack_interpreter(source, entry, str(tmp_path / "node"))
    assert not (tmp_path / "escaped").exists()


@pytest.fixture(scope="module")
def packed_python(uv_python_dir, tmp_path_factory) -> Path:
    """This machine's standalone CPython 3.11, packed as burst ships it."""
    from burst.env import interpreter

    found = interpreter.find_standalone("3.11", {"UV_PYTHON_INSTALL_DIR": str(uv_python_dir)})
    assert found is not None, "uv finds the standalone build it manages"
    return interpreter.pack(found, tmp_path_factory.mktemp("packed"))


def test_a_shipped_interpreter_is_unpacked_once_and_runs(tmp_path, packed_python):
    url = f"file://{tmp_path / 'store'}"
    entry = shipped_entry(url, packed_python)
    source = bootstrap.open_source(url, {})
    node = tmp_path / "node"
    python = bootstrap.unpack_interpreter(source, entry, str(node))
    assert bootstrap.python_version_of(python) == "3.11"
    assert Path(python).is_relative_to(node / "python")
    assert not list(node.glob("*.tar.gz*"))  # the archive is gone once unpacked
    assert bootstrap.unpack_interpreter(source, entry, str(node)) == python  # kept


def test_a_node_installs_the_locks_python_with_the_wheelhouses_uv(tmp_path, packed_python):
    import json as jsonlib
    import zipfile

    from uv import find_uv_bin

    dest, node = tmp_path / "wheelhouse", tmp_path / "node"
    dest.mkdir()
    wheel = dest / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zipped:  # where a uv wheel keeps its binary
        zipped.write(find_uv_bin(), "uv-0.13.9.data/scripts/uv")
    index = {"wheels": [{"file": wheel.name, "role": "tool"}]}
    sha = hashlib.sha256(packed_python.read_bytes()).hexdigest()
    downloads = tmp_path / "downloads.json"  # a private mirror's own list of builds
    downloads.write_text(jsonlib.dumps({"cpython-3.11.2-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux",
        "libc": "gnu", "major": 3, "minor": 11, "patch": 2, "prerelease": "",
        "url": f"file://{packed_python}", "sha256": sha, "variant": None, "build": None}}))
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "BURST_PYTHON_DOWNLOADS": str(downloads)}
    assert bootstrap.python_way("3.11", index, environ) == "uv"
    python = bootstrap.uv_install("3.11", index, str(dest), str(node), environ)
    assert bootstrap.python_version_of(python) == "3.11"
    assert Path(python).resolve().is_relative_to(node / "python-uv")

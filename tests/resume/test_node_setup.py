"""A node's setup (``burst node setup``) rebuilds the run's environment through the same
procedure as ``burst env install`` (:func:`burst.env.rebuild.rebuild`): the wheelhouse
from the store, into ``$BURST_NODE_DIR/wheelhouse``, installed with no index reachable."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from burst.contract import ENV_NODE_DIR
from burst.env import freeze, wheelhouse
from burst.env.lockfile import Package
from burst.resume import node
from burst.store import open_store
from tests.helpers.env_helpers import build_wheel, make_repo, tiny_lockfile
from tests.helpers.store_servers import free_port

RUN = "r"


@pytest.fixture
def offline_node(tmp_path, monkeypatch):
    """A node directory, a CPU card, and pip whose only index is a dead port."""
    monkeypatch.setenv(ENV_NODE_DIR, str(tmp_path / "node"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setattr("burst.env.machine.detect_gpu", lambda: None)
    monkeypatch.setattr("burst.env.machine.nvidia_device_present", lambda: False)
    return tmp_path / "node"


def _stored_run(tmp_path):
    """A run frozen with one pinned distribution, its wheel in the store's wheelhouse."""
    store = open_store(str(tmp_path / "store"))
    wheel = build_wheel(tmp_path / "wheels", "burst-tiny-alpha", "1.2.3", "VALUE = 'alpha'\n")
    lock = tiny_lockfile(Package("burst-tiny-alpha", "1.2.3"))
    freeze.freeze(store, RUN, code_dir=make_repo(tmp_path / "repo"), lock=lock)
    house = wheelhouse.Wheelhouse(wheelhouse.target_for(lock, policy="no-torch"))
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    house.wheels.append(wheelhouse.Wheel("burst-tiny-alpha", "1.2.3", wheel.name, sha256,
                                         wheel.stat().st_size, "dependency", wheel))
    wheelhouse.upload(store, RUN, lock.digest, house)
    return store, lock.digest


def test_a_node_installs_the_runs_environment_from_the_stores_wheelhouse(tmp_path,
                                                                           offline_node):
    store, digest = _stored_run(tmp_path)
    said: list[str] = []
    node.setup(RUN, store, python=None, venv=offline_node / "venv",
               code_dir=offline_node / "code", say=said.append)
    assert f"wheelhouse: 1 wheels in {offline_node / 'wheelhouse'}" in said, said
    done = subprocess.run([str(offline_node / "venv" / "bin" / "python"), "-c",
                           "import burst_tiny_alpha; print(burst_tiny_alpha.VALUE)"],
                          capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "alpha", done.stderr
    assert (offline_node / "environment-checked").read_text().split()[0] == digest

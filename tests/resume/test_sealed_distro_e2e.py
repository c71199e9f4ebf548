"""A run trained here resumes on a node of another distribution, whose Python is not the lock's.

The node is sealed as in ``test_sealed_e2e`` (only the store's port, no package index), and
its system is Debian 13's (``debootstrap --variant=minbase``: ``/usr/bin/python3`` is 3.13,
there is no 3.11 anywhere), while the run was frozen in this machine's venv on Python 3.11.
``burst resume`` finds this machine's uv-managed CPython 3.11 (the laptop's uv cache,
``$UV_PYTHON_INSTALL_DIR``), ships it to the store once, and names it in the wheelhouse
index; the node's bootstrap runs on the node's 3.13, fetches that interpreter from the
store (the only thing it reaches), checks its hash, unpacks it, builds the venv with it and
installs the cp311 wheelhouse. The run ends bitwise equal to the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.sealed_project import (
    ARGS,
    PY,
    STORE_NAME,
    assert_resumed_bitwise,
    assert_saw_nothing,
    assert_trained_in_node_venv,
    environment,
    make_project,
    sees,
)

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
RUN = "debian13"


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, moto_s3, sealed_wheel_cache, other_distribution,
            uv_python_dir) -> dict:
    """Train until SIGKILL in step 5, then resume into a sealed Debian 13 node."""
    base = tmp_path_factory.mktemp("distro")
    project, nodes = make_project(base / "project"), base / "nodes"
    env = {**environment(moto_s3.endpoint, nodes, sealed_wheel_cache),
           "BURST_STUB_SYSTEM": str(other_distribution),
           "UV_PYTHON_INSTALL_DIR": str(uv_python_dir)}
    url = moto_s3.url(STORE_NAME)  # the other sealed test's store: its wheels are there
    killed = subprocess.run([PY, "train.py", "--run-id", RUN, "--store", url, *ARGS],
                            cwd=project, capture_output=True, text=True, timeout=300,
                            check=False, env={**env, "BURST_FAULT": "kill@5",
                                              "BURST_LOCAL": str(project / ".burst")})
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = subprocess.run([PY, "-m", "burst.cli", "resume", RUN, "--to", "local", "--store",
                           url, "--local", str(project / ".burst"), "--", "python",
                           "train.py", *ARGS, "--seen", *sees(project)],
                          cwd=project, capture_output=True, text=True, timeout=1800,
                          check=False, env=env)
    print("\n".join(line for line in done.stderr.splitlines()
                    if "stub: setup on" in line or "from the store" in line))
    return {"done": done, "project": project, "nodes": nodes}


def node_home(resumed: dict) -> Path:
    done = resumed["done"]
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    homes = sorted(resumed["nodes"].glob("*/node0/home/burst-node"))
    assert len(homes) == 1, "one node, which finished the run"
    return homes[0]


def test_a_node_of_another_distribution_resumes_bitwise_equal(resumed, sealed_reference):
    assert_resumed_bitwise(node_home(resumed) / "code", resumed["project"], sealed_reference)


def test_the_node_ran_debian_13_and_got_the_locks_python_from_the_store(resumed):
    home = node_home(resumed)
    done = resumed["done"]
    assert "node python: shipped" in done.stdout + done.stderr
    assert "the node's system is" in done.stderr and "node NOT sealed" not in done.stderr
    setup = (home.parents[1] / "setup.log").read_text()
    assert "Python 3.11" in setup and "from the store" in setup
    seen = json.loads((home / "code" / "seen.json").read_text())
    assert Path(seen["executable"]).is_relative_to(home / "venv")
    venv_python = (home / "venv" / "pyvenv.cfg").read_text()
    assert f"home = {home / 'python'}" in venv_python  # the unpacked standalone, not 3.13
    assert "version_info = 3.11" in venv_python or "version = 3.11" in venv_python


def test_the_debian_node_saw_nothing_of_this_machine(resumed):
    code = node_home(resumed) / "code"
    assert_saw_nothing(code, sees(resumed["project"]))
    assert_trained_in_node_venv(code)

"""Issue 15's acceptance test: a killed run resumes in a sealed node that has only the store.

A project in a temporary directory (``train.py`` and a local module it imports, ``model.py``)
trains with burst against a real S3 server on 127.0.0.1 (moto over HTTP) and is killed
(SIGKILL) in step 5. ``burst resume RUN --to local`` (no ``--node-python``) then runs the
task in a sealed node (``BURST_STUB_SEAL=require``: no fallback to an unsealed one): the
system's ``/usr/bin/python3``, a stock PATH, no pip configuration or wheels, every package
index unreachable, nothing of this machine but the store's port. The node must bootstrap
burst and the whole environment from the store (wheelhouse, code archive), resume and end
bitwise equal to an uninterrupted run; the training script writes down what it saw, so
the test can check from inside that the source tree, the local store and the user's venv
were not there.

The same run resumes twice: on a node whose system is this machine's, and on one whose
system is Debian 13's (``debootstrap --variant=minbase``: ``/usr/bin/python3`` is 3.13,
no 3.11 anywhere) while the run was frozen here on 3.11. There ``burst resume`` finds this
machine's uv-managed CPython 3.11 (the laptop's uv cache, ``$UV_PYTHON_INSTALL_DIR``),
ships it to the store once and names it in the wheelhouse index; the bootstrap runs on the
node's 3.13, fetches it from the store (all it reaches), checks its hash, unpacks it and
builds the venv with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.sealed_project import (
    ARGS,
    STORE_NAME,
    assert_resumed_bitwise,
    assert_saw_nothing,
    assert_trained_in_node_venv,
    environment,
    kill_then_resume,
    make_project,
    sees,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500),  # a node's whole setup, loaded
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
THIS_MACHINE, DEBIAN = "this-machine", "debian13"


@pytest.fixture(scope="module", params=[THIS_MACHINE, DEBIAN])
def resumed(request, tmp_path_factory, moto_s3, sealed_wheel_cache) -> dict:
    """Train until SIGKILL in step 5, then ``burst resume --to local`` into a sealed node
    (of this machine's system, or of Debian 13's)."""
    base = tmp_path_factory.mktemp("sealed")
    project, nodes = make_project(base / "project"), base / "nodes"
    env = environment(moto_s3.endpoint, nodes, sealed_wheel_cache)
    run_id = STORE_NAME if request.param == THIS_MACHINE else request.param
    if request.param == DEBIAN:
        env.update({"BURST_STUB_SYSTEM": str(request.getfixturevalue("other_distribution")),
                    "UV_PYTHON_INSTALL_DIR": str(request.getfixturevalue("uv_python_dir"))})
    url = moto_s3.url(STORE_NAME)  # one store: the second run uploads no wheel again
    done = kill_then_resume(project, url, run_id, env, "kill@5", ARGS,
                            ("--seen", *sees(project)))
    setup = [line for line in done.stderr.splitlines() if "stub: setup on" in line]
    wheels = list(nodes.glob("*/node0/home/burst-node/wheelhouse/*.whl"))
    setup.append(f"wheelhouse: {len(wheels)} wheels, "
                 f"{sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB")
    print("\n".join(setup))  # the node's setup time and wheelhouse (pytest -s shows them)
    return {"done": done, "project": project, "nodes": nodes, "system": request.param}


def node_code(resumed: dict) -> Path:
    done = resumed["done"]
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    codes = sorted(resumed["nodes"].glob("*/node0/home/burst-node/code"))
    assert len(codes) == 1, "one node, which finished the run"
    return codes[0]


def test_sealed_node_resumes_bitwise_equal_to_an_uninterrupted_run(resumed, sealed_reference):
    assert_resumed_bitwise(node_code(resumed), resumed["project"], sealed_reference)


def test_sealed_node_sees_no_source_tree_local_store_or_venv(resumed):
    assert_saw_nothing(node_code(resumed), sees(resumed["project"]))


def test_sealed_node_trains_in_its_own_venv_built_from_the_store(resumed):
    assert_trained_in_node_venv(node_code(resumed))
    assert "node NOT sealed" not in resumed["done"].stderr


def test_a_debian_13_node_gets_the_locks_python_from_the_store(resumed):
    if resumed["system"] != DEBIAN:
        pytest.skip("this machine's system has the lock's Python")
    code = node_code(resumed)
    home, done = code.parent, resumed["done"]
    assert "node python: shipped" in done.stderr
    assert "the node's system is" in done.stderr
    setup = (home.parents[1] / "setup.log").read_text()
    assert "Python 3.11" in setup and "from the store" in setup
    seen = json.loads((code / "seen.json").read_text())
    assert Path(seen["executable"]).is_relative_to(home / "venv")
    config = (home / "venv" / "pyvenv.cfg").read_text()
    assert f"home = {home / 'python'}" in config  # the unpacked standalone, not Debian's 3.13

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
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sealed_project import (
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

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
RUN = STORE_NAME


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, moto_s3, sealed_wheel_cache) -> dict:
    """Train until SIGKILL in step 5, then ``burst resume --to local`` into a sealed node."""
    base = tmp_path_factory.mktemp("sealed")
    project, nodes = make_project(base / "project"), base / "nodes"
    env = environment(moto_s3.endpoint, nodes, sealed_wheel_cache)
    url = moto_s3.url(STORE_NAME)
    done = kill_then_resume(project, url, RUN, env, "kill@5", ARGS,
                            ("--seen", *sees(project)))
    setup = [line for line in done.stderr.splitlines() if "stub: setup on" in line]
    wheels = list(nodes.glob("*/node0/home/burst-node/wheelhouse/*.whl"))
    setup.append(f"wheelhouse: {len(wheels)} wheels, "
                 f"{sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB")
    print("\n".join(setup))  # the node's setup time and wheelhouse (pytest -s shows them)
    return {"done": done, "project": project, "nodes": nodes}


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

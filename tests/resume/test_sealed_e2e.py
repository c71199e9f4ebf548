"""Issue 15's acceptance test: a killed run resumes in a sealed node that has only the store,
through either launcher.

A project in a temporary directory (``train.py`` and a local module it imports, ``model.py``)
trains with burst against a real S3 server on 127.0.0.1 (moto over HTTP) and is killed
(SIGKILL) in step 5. ``burst resume RUN --to ...`` (no ``--node-python``) then runs the task
on a node that has nothing of this machine but the store's port, and every package index
unreachable. The node must bootstrap burst and the whole environment from the store
(wheelhouse, code archive), resume and end bitwise equal to an uninterrupted run; the
training script writes down what it saw, so the test can check from inside that the source
tree, the local store and the user's venv were not there. The node is one of:

- ``local``: the local stub's sealed node (``BURST_STUB_SEAL=require``: no fallback to an
  unsealed one): the system's ``/usr/bin/python3``, a stock PATH, no pip configuration or
  wheels. It runs twice: on a node whose system is this machine's, and on one whose system
  is Debian 13's (``debootstrap --variant=minbase``: ``/usr/bin/python3`` is 3.13, no 3.11
  anywhere) while the run was frozen here on 3.11. There ``burst resume`` finds this
  machine's uv-managed CPython 3.11 (the laptop's uv cache, ``$UV_PYTHON_INSTALL_DIR``),
  ships it to the store once and names it in the wheelhouse index; the bootstrap runs on
  the node's 3.13, fetches it from the store (all it reaches), checks its hash, unpacks it
  and builds the venv with it.
- ``ssh``: ``--to ssh://root@127.0.0.1:PORT``, a real OpenSSH server in a sealed root
  (tests/helpers/sealed_sshd.py): the system's ``/usr``, ``/lib*`` and ``/etc`` read-only,
  nothing else of this machine, a network with only ``lo`` where the store's port is
  relayed out and the SSH port in.

Every run shares one store (``s3://burst/sealed``, a run id each): wheels are
content-addressed and shared by every run of a store, so the SSH run, which comes after the
local ones, must upload no wheel again.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import sealed_project
from tests.helpers.sealed_project import (
    ARGS,
    PY,
    STORE_NAME,
    assert_resumed_bitwise,
    assert_saw_nothing,
    assert_trained_in_node_venv,
    environment,
    kill_then_resume,
    make_project,
)
from tests.helpers.sealed_sshd import problem, sealed_sshd
from tests.helpers.store_servers import BUCKET

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500),  # a node's whole setup, loaded
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
THIS_MACHINE, DEBIAN = "this-machine", "debian13"
#: (launcher, the node's system), in the order they run: the local stub fills the store first.
NODES = [("local", THIS_MACHINE), ("local", DEBIAN), ("ssh", THIS_MACHINE)]
RUN_IDS = {("local", THIS_MACHINE): STORE_NAME, ("local", DEBIAN): DEBIAN,
           ("ssh", THIS_MACHINE): "sealed-ssh"}
WHEELS = f"{STORE_NAME}/wheels/"
#: What any fresh home on the SSH box may hold once pip and burst have run there.
FRESH_HOME = {".cache", ".config", ".local", ".ssh", ".bashrc", ".profile", ".python_history"}


def sees(launcher: str, project: Path) -> list[str]:
    """What the node must not see. The SSH box logs in as root too, with a fresh ``/root``
    of its own: there, what this machine's HOME holds, entry by entry."""
    if launcher == "local":
        return sealed_project.sees(project)
    home = Path.home()
    mine = sorted(str(p) for p in home.iterdir() if p.name not in FRESH_HOME) \
        if home.is_dir() else []
    return [str(ROOT), str(ROOT / "burst"), str(project), str(project / ".burst"),
            sys.prefix, os.path.realpath(PY), *mine[:20]]


def wheel_keys(moto_s3) -> dict[str, tuple[str, str]]:
    """Every wheel the shared store holds, as S3 key -> (ETag, LastModified): a wheel
    uploaded again would show a new LastModified even with the same content."""
    pages = moto_s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                       Prefix=WHEELS)
    return {item["Key"]: (item["ETag"], str(item["LastModified"]))
            for page in pages for item in page.get("Contents", [])}


def on_the_stub(request, project: Path, url: str, env: dict, system: str) -> dict:
    """``burst resume --to local`` into a sealed node of this machine's system or Debian's."""
    nodes = Path(env["BURST_STUB_ROOT"])
    if system == DEBIAN:
        env.update({"BURST_STUB_SYSTEM": str(request.getfixturevalue("other_distribution")),
                    "UV_PYTHON_INSTALL_DIR": str(request.getfixturevalue("uv_python_dir"))})
    done = kill_then_resume(project, url, RUN_IDS["local", system], env, "kill@5", ARGS,
                            ("--seen", *sees("local", project)))
    setup = [line for line in done.stderr.splitlines() if "stub: setup on" in line]
    wheels = list(nodes.glob("*/node0/home/burst-node/wheelhouse/*.whl"))
    setup.append(f"wheelhouse: {len(wheels)} wheels, "
                 f"{sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB")
    print("\n".join(setup))  # the node's setup time and wheelhouse (pytest -s shows them)
    return {"done": done, "codes": sorted(nodes.glob("*/node0/home/burst-node/code")),
            "log": ""}


def over_ssh(tmp_path_factory, moto_s3, project: Path, url: str, env: dict) -> dict:
    """``burst resume --to ssh://`` onto the sealed box."""
    problem_here = problem()
    if problem_here:
        pytest.skip(f"no sealed sshd here: {problem_here}")
    port = int(moto_s3.endpoint.rsplit(":", 1)[1])
    with sealed_sshd(tmp_path_factory.mktemp("ssh-box"), [port]) as box:
        keys = ("--known-hosts", str(box.known_hosts), "--identity", str(box.client_key),
                "--remote-dir", str(box.box / "nodes"))
        done = kill_then_resume(project, url, RUN_IDS["ssh", THIS_MACHINE], env, "kill@5",
                                ARGS, ("--seen", *sees("ssh", project)), box.url, keys)
        sshd_log = box.log.read_text(errors="replace")
    print("\n".join(line for line in done.stderr.splitlines() if "wheel" in line))
    nodes = sorted((box.box / "nodes").glob("*/job.sh"))
    seen = sorted((box.box / "nodes").glob("*/code/seen.json"))
    if nodes and seen:  # the node's setup (and pull) until train.py started, for pytest -s
        print(f"box: setup until train.py started took "
              f"{seen[0].stat().st_mtime - nodes[0].stat().st_mtime:.1f}s")
    return {"done": done, "codes": sorted((box.box / "nodes").glob("*/code")),
            "log": sshd_log[-1500:]}


@pytest.fixture(scope="module", params=NODES, ids=["-".join(node) for node in NODES])
def resumed(request, tmp_path_factory, moto_s3, sealed_wheel_cache) -> dict:
    """Train until SIGKILL in step 5, then ``burst resume`` onto a sealed node through
    ``launcher``; the store's wheels before and after."""
    launcher, system = request.param
    base = tmp_path_factory.mktemp(f"sealed-{launcher}")
    project = make_project(base / "project")
    env = environment(moto_s3.endpoint, base / "nodes", sealed_wheel_cache)
    url = moto_s3.url(STORE_NAME)  # one store for every run: wheels are uploaded once
    before = wheel_keys(moto_s3)
    if launcher == "local":
        run = on_the_stub(request, project, url, env, system)
    else:
        run = over_ssh(tmp_path_factory, moto_s3, project, url, env)
    return {**run, "project": project, "launcher": launcher, "system": system,
            "before": before, "after": wheel_keys(moto_s3)}


def node_code(resumed: dict) -> Path:
    done = resumed["done"]
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:] + resumed["log"]
    assert len(resumed["codes"]) == 1, "one node, which finished the run"
    return resumed["codes"][0]


def test_sealed_node_resumes_bitwise_equal_to_an_uninterrupted_run(resumed, sealed_reference):
    assert_resumed_bitwise(node_code(resumed), resumed["project"], sealed_reference)


def test_sealed_node_sees_no_source_tree_local_store_or_venv(resumed):
    assert_saw_nothing(node_code(resumed), sees(resumed["launcher"], resumed["project"]))


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


def test_a_second_run_in_the_store_uploads_no_wheel_again(resumed):
    """The wheelhouse is content-addressed and shared by every run of a store: the same
    environment (and burst's own wheel, rebuilt reproducibly from the same source) puts
    no new wheel there, and no wheel the store has is written again."""
    node_code(resumed)
    if resumed["launcher"] != "ssh":
        pytest.skip("the local stub's runs fill the store (the Debian one ships its Python)")
    before, after = resumed["before"], resumed["after"]
    if not before:
        pytest.skip("no local run filled this store first in this session (deselected)")
    new = sorted(set(after) - set(before))
    assert not new, f"wheels uploaded by the second run: {new} (burst's own wheel differs " \
                    "when burst/ or README.md changed between the runs)"
    assert {key: after[key] for key in before} == before  # none written again

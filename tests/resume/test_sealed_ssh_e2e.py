"""Issue 15's acceptance through SSH: a killed run resumes on a sealed box that has only the
store, reached with ``burst resume RUN --to ssh://root@127.0.0.1:PORT``.

The box is a real OpenSSH server in a sealed root (tests/helpers/sealed_sshd.py): the system's
``/usr``, ``/lib*`` and ``/etc`` read-only, nothing else of this machine, a network with
only ``lo`` where the store's port is relayed out and the SSH port in, so every package
index is unreachable for real. The project, training script and uninterrupted reference
are the ``--to local`` sealed test's (tests/resume/test_sealed_e2e.py); the run is killed
(SIGKILL) in step 5 against a real S3 server on 127.0.0.1 (moto), and the box must
bootstrap burst and the environment from the store (wheelhouse, code archive), resume and
end bitwise equal to the uninterrupted run, without seeing the source tree, the local
store or the user's venv.

The store is the ``--to local`` test's (``s3://burst/sealed``, another run id): wheels are
content-addressed and shared by every run of a store, so when that test ran first in the
session this one must upload no wheel again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.sealed_project import (
    ARGS,
    PY,
    STORE_NAME,
    assert_resumed_bitwise,
    assert_saw_nothing,
    assert_trained_in_node_venv,
    environment,
    make_project,
)
from tests.helpers.sealed_sshd import problem, sealed_sshd
from tests.helpers.store_servers import BUCKET

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed box needs root")]
RUN = "sealed-ssh"
WHEELS = f"{STORE_NAME}/wheels/"
#: What any fresh home on the box may hold once pip and burst have run there.
FRESH_HOME = {".cache", ".config", ".local", ".ssh", ".bashrc", ".profile", ".python_history"}


def sees(project: Path) -> list[str]:
    """What the box must not see: burst's source tree, the project (the run's source), its
    local store, the user's venv and interpreter, and what this machine's HOME holds (the
    box logs in as root too: its own ``/root`` is a fresh one)."""
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


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, moto_s3, sealed_wheel_cache) -> dict:
    """Train until SIGKILL in step 5, then ``burst resume --to ssh://`` onto the sealed box."""
    problem_here = problem()
    if problem_here:
        pytest.skip(f"no sealed sshd here: {problem_here}")
    base = tmp_path_factory.mktemp("sealed-ssh")
    project = make_project(base / "project")
    env = environment(moto_s3.endpoint, base / "unused-stub-nodes", sealed_wheel_cache)
    url = moto_s3.url(STORE_NAME)
    before = wheel_keys(moto_s3)
    killed = subprocess.run([PY, "train.py", "--run-id", RUN, "--store", url, *ARGS],
                            cwd=project, capture_output=True, text=True, timeout=300,
                            check=False, env={**env, "BURST_FAULT": "kill@5",
                                              "BURST_LOCAL": str(project / ".burst")})
    assert killed.returncode == -9, killed.stderr[-3000:]
    port = int(moto_s3.endpoint.rsplit(":", 1)[1])
    with sealed_sshd(tmp_path_factory.mktemp("ssh-box"), [port]) as box:
        done = subprocess.run(
            [PY, "-m", "burst.cli", "resume", RUN, "--to", box.url, "--store", url,
             "--local", str(project / ".burst"), "--known-hosts", str(box.known_hosts),
             "--identity", str(box.client_key), "--remote-dir", str(box.box / "nodes"),
             "--", "python", "train.py", *ARGS, "--seen", *sees(project)],
            cwd=project, capture_output=True, text=True, timeout=1800, check=False, env=env)
        sshd_log = box.log.read_text(errors="replace")
    print("\n".join(line for line in done.stderr.splitlines() if "wheel" in line))
    nodes = sorted((box.box / "nodes").glob("*/job.sh"))
    seen = sorted((box.box / "nodes").glob("*/code/seen.json"))
    if nodes and seen:  # the node's setup (and pull) until train.py started, for pytest -s
        print(f"box: setup until train.py started took "
              f"{seen[0].stat().st_mtime - nodes[0].stat().st_mtime:.1f}s")
    return {"done": done, "project": project, "box": box, "before": before,
            "after": wheel_keys(moto_s3), "sshd_log": sshd_log}


def node_code(resumed: dict) -> Path:
    done = resumed["done"]
    assert done.returncode == 0, (done.stderr[-4000:] + done.stdout[-4000:]
                                  + resumed["sshd_log"][-1500:])
    codes = sorted((resumed["box"].box / "nodes").glob("*/code"))
    assert len(codes) == 1, "one node directory on the box, which finished the run"
    return codes[0]


def test_sealed_ssh_box_resumes_bitwise_equal_to_an_uninterrupted_run(resumed, sealed_reference):
    assert_resumed_bitwise(node_code(resumed), resumed["project"], sealed_reference)


def test_sealed_ssh_box_sees_no_source_tree_local_store_or_venv(resumed):
    assert_saw_nothing(node_code(resumed), sees(resumed["project"]))


def test_sealed_ssh_box_trains_in_its_own_venv_built_from_the_store(resumed):
    assert_trained_in_node_venv(node_code(resumed))


def test_a_second_run_in_the_store_uploads_no_wheel_again(resumed):
    """The wheelhouse is content-addressed and shared by every run of a store: the same
    environment (and burst's own wheel, rebuilt reproducibly from the same source) puts
    no new wheel there, and no wheel the store has is written again."""
    node_code(resumed)
    before, after = resumed["before"], resumed["after"]
    if not before:
        pytest.skip("the --to local sealed test did not fill this store first in this session")
    new = sorted(set(after) - set(before))
    assert not new, f"wheels uploaded by the second run: {new} (burst's own wheel differs " \
                    "when burst/ or README.md changed between the two tests)"
    assert {key: after[key] for key in before} == before  # none written again

"""The address-matching demo end to end: a CUDA OOM injected into a real run, resumed by
the agent (re-planned) and by ``burst resume --to local`` with the layout kept, against a
run that never stopped; then ``burst report`` on the failed run. A step that fails fails
the demo: nothing falls back to another path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from burst import events
from burst.store import LocalStore
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e
DEMO = [sys.executable, str(ROOT / "scripts" / "demo.py"), "--quick", "--json"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo")
    done = subprocess.run([*DEMO, "--workdir", str(workdir)], capture_output=True, text=True,
                          timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, json.loads(done.stdout)["runs"]


def test_demo_oom_resume_matches_uninterrupted_run(demo):
    workdir, (reference, retried, kept) = demo
    assert retried["failure"] == kept["failure"] == "oom"
    assert retried["resumed_from_step"] == retried["failed_in_step"] - 1  # nothing lost
    assert retried["micro_batch"] == 16 and retried["steps"] == reference["steps"] == 24
    assert kept["identical"] and kept["max_param_diff"] == 0.0  # layout kept: bitwise
    assert retried["max_param_diff"] < 0.1  # re-planned: same samples, other rounding
    assert (workdir / "report" / "index.html").is_file()


def test_demo_resumes_the_stopped_run_through_the_local_launcher(demo):
    workdir, _ = demo
    history = events.read(LocalStore(workdir / "store"), "oom-kept")
    names = [e["event"] for e in history]
    launch = next(e for e in history if e["event"] == "launch")
    ended = next(e for e in history if e["event"] == "launch-end")
    node_exit = next(e for e in history if e["event"] == "node-exit")
    assert launch["to"] == ended["to"] == "local" and ended["returncode"] == 0
    assert node_exit["returncode"] == 0
    # the training resumed once, and on the node the launch started
    assert names.count("resume") == 1
    assert names.index("launch") < names.index("node-start") < names.index("resume")


def test_demo_fails_naming_the_step_when_its_resume_fails(tmp_path):
    # the demo's node runs this machine's interpreter, which a sealed node cannot: requiring
    # a sealed node makes `burst resume --to local` refuse, and nothing may paper over it
    env = {**os.environ, "BURST_STUB_SEAL": "require"}
    done = subprocess.run([*DEMO, "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=400, check=False, env=env)
    assert done.returncode != 0
    assert "demo: step 3 (burst resume --to local) failed" in done.stderr
    assert not (tmp_path / "report").exists()

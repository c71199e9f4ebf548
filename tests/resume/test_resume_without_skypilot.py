"""A plain install (no ``[cloud]`` extra, no SkyPilot anywhere) resumes to the local stub:
the task is rendered and read back without SkyPilot, the resume says its parser did not
check it, and the run finishes on the stub's node. The training environment also holds
current transformers with burst, which SkyPilot's pins (``click<8.2``) would not allow."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE

PY = sys.executable
ARGS = ("--samples", "64", "--epochs", "2", "--flush")


def without_skypilot() -> dict[str, str]:
    """This environment with no way to SkyPilot: no $BURST_SKYPILOT_PYTHON, no ``sky`` on
    PATH (only this interpreter's directory and the system's)."""
    env = {k: v for k, v in os.environ.items() if k != "BURST_SKYPILOT_PYTHON"}
    env["PATH"] = os.pathsep.join([str(Path(PY).parent), "/usr/bin", "/bin"])
    return env


def test_the_training_environment_holds_no_skypilot():
    assert importlib.util.find_spec("sky") is None, \
        "the test venv must not hold SkyPilot (scripts/setup.sh puts it in .venv-sky)"
    assert shutil.which("sky", path=without_skypilot()["PATH"]) is None


def test_burst_and_current_transformers_install_together():
    pytest.importorskip("transformers")
    done = subprocess.run([PY, "-m", "pip", "check"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout


@pytest.mark.e2e
def test_resume_to_the_local_stub_needs_no_skypilot(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLE, project / "train.py")
    env = {**without_skypilot(), "PYTHONHASHSEED": "0", "BURST_OFFLINE": "1",
           "BURST_NODE_GPU": "cpu"}
    failed = subprocess.run([PY, "train.py", "--run-id", "plain", *ARGS], cwd=project,
                            env={**env, "BURST_FAULT": "sticky@5"}, capture_output=True,
                            text=True, timeout=240, check=False)
    assert failed.returncode == 87, failed.stderr[-2000:]
    done = subprocess.run([PY, "-m", "burst.cli", "resume", "plain", "--to", "local",
                           "--offline", "--node-python", PY, "--stub-root",
                           str(tmp_path / "nodes"), "--", "python", "train.py", *ARGS],
                          cwd=project, env=env, capture_output=True, text=True, timeout=280,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "SkyPilot is not installed, so its parser did not check the task" in done.stderr
    assert "resumed at step" in done.stdout + done.stderr  # the node restored the snapshot and trained on

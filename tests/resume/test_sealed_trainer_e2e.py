"""A Hugging Face Trainer run, SIGKILLed, resumes in a sealed node that has only the store.

The project is scripts/example_transformers.py as a user's ``train.py`` (a tiny GPT-2 built
from a config: no hub download, so the run needs no inputs beyond its code). It trains
against a real S3 server on 127.0.0.1 (moto), is killed (SIGKILL) in step 5, and
``burst resume --to local`` runs it in a sealed node (``BURST_STUB_SEAL=require``): the
system's Python, no pip configuration, every package index unreachable. The node
bootstraps burst, transformers and the rest of the environment from the store's
wheelhouse and must end bitwise equal to the same script run without a stop."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, assert_same
from tests.helpers.sealed_project import PY, environment, kill_then_resume

pytest.importorskip("transformers")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500),  # the node installs transformers
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
RUN = "sealed-trainer"
ARGS = ("--samples", "32", "--epochs", "2", "--persist-every", "2", "--final", "final.pt")
OFFLINE = {"HF_HUB_OFFLINE": "1", "BURST_FREEZE": "1", "PYTHONHASHSEED": "0"}


def project(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "example_transformers.py", root / "train.py")
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    root = project(tmp_path_factory.mktemp("trainer-reference") / "project")
    done = subprocess.run([PY, "train.py", "--run-id", "reference", "--store",
                           str(root / ".burst"), *ARGS], cwd=root, capture_output=True,
                          text=True, timeout=600, check=False, env={**os.environ, **OFFLINE})
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(root / "final.pt", weights_only=True)


def test_sealed_node_resumes_a_trainer_run_bitwise(tmp_path, moto_s3, sealed_wheel_cache,
                                                   reference):
    root, nodes = project(tmp_path / "project"), tmp_path / "nodes"
    env = {**environment(moto_s3.endpoint, nodes, sealed_wheel_cache), **OFFLINE}
    url = moto_s3.url(RUN)
    done = kill_then_resume(root, url, RUN, env, "kill@5:1", ARGS)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-3000:]
    assert "node NOT sealed" not in done.stderr
    (code,) = sorted(nodes.glob("*/node0/home/burst-node/code"))
    final = torch.load(code / "final.pt", weights_only=True)
    assert final["losses"] == reference["losses"]
    assert_same(final["model"], reference["model"])

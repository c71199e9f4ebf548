"""Issue 29's acceptance test: a real user's project resumes in a sealed node, data and all.

The project (``tests/helpers/user_project.py``) is a git repository with its own ``.venv``, a
gitignored ``data/`` folder, its data set under ``$HOME/data`` (a memmapped token file and
a folder of shards) and pretrained weights in a Hugging Face style cache under
``$HOME/.cache``. It trains with the venv's interpreter named by its absolute path against
a real S3 server on 127.0.0.1 (moto) and is SIGKILLed in step 5; ``burst resume --to local``
then runs it in a sealed node that has nothing of this machine (no ``$HOME``, no project,
no venv): the node must get the code, the environment and the inputs from the store, place
the inputs where the script reads them, and end bitwise equal to an uninterrupted run. The
script writes down, from inside the node, the SHA-256 of everything it read and which of
this machine's paths it could see.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.sealed_project import (
    PY,
    STORE_NAME,
    assert_resumed_bitwise,
    assert_trained_in_node_venv,
    environment,
)
from tests.helpers.user_project import make_home, make_project, python_of, reference, train_args

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500),  # a node's whole setup, loaded
              pytest.mark.skipif(os.geteuid() != 0, reason="a sealed node needs root")]
RUN_ID = "user-project"


def hidden(home: Path, project: Path) -> list[str]:
    """What the node must not see: the user's note it never read, the project, its venv,
    burst's source tree."""
    return [str(home / "notes" / "unread.txt"), str(home / "notes"), str(project),
            str(project / ".venv"), str(ROOT / "burst"), PY]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, moto_s3, sealed_wheel_cache) -> dict:
    base = tmp_path_factory.mktemp("user")
    home, project = make_home(base / "home"), make_project(base / "project")
    env = {**environment(moto_s3.endpoint, base / "nodes", sealed_wheel_cache),
           "HOME": str(home)}
    python, url = python_of(project), moto_s3.url(STORE_NAME)  # wheels shared with others
    killed = subprocess.run([python, "train.py", "--run-id", RUN_ID, "--store", url,
                             *train_args(home)], cwd=project, capture_output=True, text=True,
                            timeout=600, check=False,
                            env={**env, "BURST_FAULT": "kill@5",
                                 "BURST_LOCAL": str(project / ".burst")})
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = subprocess.run([python, "-m", "burst.cli", "resume", RUN_ID, "--to", "local",
                           "--store", url, "--local", str(project / ".burst"), "--", python,
                           "train.py", *train_args(home), "--seen", *hidden(home, project)],
                          cwd=project, capture_output=True, text=True, timeout=1800,
                          check=False, env=env)
    return {"killed": killed, "done": done, "home": home, "project": project,
            "nodes": base / "nodes"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[list[dict], dict]:
    return reference(tmp_path_factory.mktemp("user-reference"))


def node_code(resumed: dict) -> Path:
    done = resumed["done"]
    assert done.returncode == 0, done.stderr[-5000:] + done.stdout[-3000:]
    (code,) = sorted(resumed["nodes"].glob("*/node0/home/burst-node/code"))
    return code


def seen(resumed: dict) -> dict:
    return json.loads((node_code(resumed) / "seen.json").read_text())


def test_a_users_project_resumes_bitwise_equal_to_an_uninterrupted_run(resumed, uninterrupted):
    assert_resumed_bitwise(node_code(resumed), resumed["project"], uninterrupted)


def test_the_node_read_this_machines_data_set_and_weights_from_the_store(resumed):
    read = seen(resumed)["read"]
    home = resumed["home"]
    assert str(home / "data" / "tokens.bin") in read and "data/vocab.json" in read
    assert len([p for p in read if "/shards/" in p]) == 12
    for path, digest in read.items():
        here = resumed["project"] / path if not path.startswith("/") else Path(path)
        assert hashlib.sha256(here.read_bytes()).hexdigest() == digest, path


def test_the_node_sees_none_of_this_machines_files_but_the_placed_inputs(resumed):
    view = seen(resumed)
    assert view["paths"] == {path: False for path in hidden(resumed["home"],
                                                            resumed["project"])}
    assert view["inputs_map"] and view["data"] == str(resumed["home"] / "data")
    assert view["hf_home"] == str(resumed["home"] / ".cache" / "huggingface")
    setup = (node_code(resumed).parents[2] / "setup.log").read_text()
    assert "inputs: 4.0 MB fetched from the store and verified" in setup


def test_the_users_venv_interpreter_runs_as_the_nodes_own(resumed):
    assert_trained_in_node_venv(node_code(resumed))


def test_the_run_said_which_inputs_travel_and_warned_of_its_gitignored_one(resumed):
    said = resumed["killed"].stderr
    assert f"inputs: input {resumed['home'] / 'data'}: shipping 1 file(s), 4.0 MB" in said
    assert "inputs: hub cache" in said
    assert "warning: data/vocab.json is ignored by git (data/ in .gitignore)" in said

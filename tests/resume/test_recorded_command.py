"""A run started as plain ``python train.py`` (no agent) is resumed without ``--``: it
recorded its own command line, and ``burst resume`` renders that for the node."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.store import LocalStore

pytestmark = pytest.mark.e2e

TRAIN = """\
import torch
import burst

run = burst.Run("plain", store={store!r}, global_batch=4)
model = torch.nn.Linear(2, 1)
run.attach(model)
for step in run.batches(lambda: torch.ones(4, 2), steps=2):
    for x in step:
        model(x).sum().backward()
run.close()
"""


def test_a_run_started_without_the_agent_is_resumed_with_the_command_it_was_started_with(
        tmp_path, monkeypatch):
    project, store = tmp_path / "proj", tmp_path / "store"
    project.mkdir()
    (project / "train.py").write_text(TRAIN.format(store=str(store)))
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    env = {**os.environ, "BURST_WHEELS": "none"}
    env.pop("BURST_FAILURE_DIR", None)
    done = subprocess.run([sys.executable, "-u", "train.py", "--lr", "0.1"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    start = next(e for e in events.read(LocalStore(store), "plain") if e["event"] == "start")
    assert start["command"].endswith("-u train.py --lr 0.1")

    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    result = CliRunner().invoke(main, ["resume", "plain", "--dry-run", "--offline",
                                       "--to", "skypilot", "--gpu", "A100",
                                       "--store", str(store)])
    assert result.exit_code == 0, result.output
    task = yaml.safe_load(result.output[result.output.index("# burst resume plain:"):
                                        result.output.index("\ncommands")])
    assert "node run -- python -u train.py --lr 0.1" in task["run"]

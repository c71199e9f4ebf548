"""``burst resume`` refuses, in one line and before anything launches, a run whose inputs
include one that cannot be shipped to a node."""

from __future__ import annotations

import os

from click.testing import CliRunner

from burst.cli import main
from burst.env import lockfile
from burst.inputs import part
from burst.store import open_store
from tests.helpers.plan_helpers import manifest, put_manifest


def test_burst_resume_refuses_an_input_that_cannot_be_shipped_in_one_line(tmp_path):
    store = open_store(str(tmp_path / "store"))
    put_manifest(store, manifest("run", global_batch=64, micro=8, amp=None))
    lockfile.save(store, "run", lockfile.build())
    os.mkfifo(tmp_path / "pipe")
    part.InputsPart("run", [tmp_path / "pipe"], record=False, say=lambda _l: None).stage(store)
    result = CliRunner().invoke(main, ["resume", "run", "--dry-run", "--offline", "--to",
                                       "local", "--store", str(tmp_path / "store"), "--",
                                       "python", "train.py"])
    assert result.exit_code != 0
    refusal = [line for line in result.output.splitlines() if "cannot be shipped" in line]
    assert refusal == [f"Error: input {tmp_path / 'pipe'} cannot be shipped to a node: a "
                       "device, FIFO or socket, not a file; exclude it ([inputs] exclude) or "
                       "make it shippable, then run again"]
    assert "Traceback" not in result.output and "candidates" not in result.output

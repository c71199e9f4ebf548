"""Inputs a run declares: ``burst run --input`` hands them to the training process, and a
``burst.Run(inputs=...)`` ships them whether the run has read them yet or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from burst.inputs import chunks, names
from burst.store import open_store


def test_burst_run_input_hands_absolute_paths_to_the_training_process(tmp_path, dataset):
    out = tmp_path / "seen.txt"
    child = f"import os; open({str(out)!r}, 'w').write(os.environ[{names.INPUTS_ENV!r}])"
    done = subprocess.run([sys.executable, "-m", "burst.cli", "run", "--run-id", "r",
                           "--store", str(tmp_path / "store"), "--input", "data/docs",
                           "--input", "s3://bucket/corpus", "--", sys.executable, "-c", child],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text()) == [str(dataset / "docs"), "s3://bucket/corpus"]


def test_a_run_ships_its_declared_inputs_before_reading_them(tmp_path, dataset):
    script = f"""
import torch, burst
run = burst.Run("declared", store={str(tmp_path / 'store')!r}, global_batch=1,
                inputs=[{str(dataset / 'docs')!r}])
model = torch.nn.Linear(1, 1)
run.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
run.snapshot(wait=True)
run.close()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "BURST_CONFIG": os.devnull})
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = chunks.load(open_store(str(tmp_path / "store")), "declared")
    assert manifest is not None
    assert sorted(f.path for f in manifest.files) == sorted(str(p) for p in
                                                             (dataset / "docs").iterdir())
    assert f"inputs: input {dataset / 'docs'}: shipping 3 file(s)" in done.stderr

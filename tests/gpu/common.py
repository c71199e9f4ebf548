"""What the GPU checks share: the marks, and running ``gpu_train.py`` as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

MARKS = [pytest.mark.gpu,
         pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TRAIN = Path(__file__).with_name("gpu_train.py")


def env() -> dict[str, str]:
    """The child's environment: burst importable, cuBLAS deterministic (exact losses)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "BURST_FREEZE": "0"}


def train(workdir: Path, run_id: str, *args: str, supervised: tuple[str, ...] | None = None
          ) -> subprocess.CompletedProcess:
    """``gpu_train.py`` for ``run_id`` in ``workdir``; under ``burst run`` with
    ``supervised`` as its options when given."""
    script = [sys.executable, str(TRAIN), "--records", str(workdir / f"{run_id}.jsonl"),
              "--store", str(workdir / "store"), *args]
    cmd = script if supervised is None else [
        sys.executable, "-m", "burst.cli", "run", "--run-id", run_id,
        "--store", str(workdir / "store"), "--local", str(workdir / "store"),
        *supervised, "--", *script]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False,
                          cwd=workdir, env={**env(), "BURST_RUN_ID": run_id})


def records(workdir: Path, run_id: str) -> list[dict]:
    """Per-step records; a step replayed after a failure replaces the failed attempt's."""
    latest: dict[int, dict] = {}
    for line in (workdir / f"{run_id}.jsonl").read_text().splitlines():
        record = json.loads(line)
        latest[record["step"]] = record
    return [latest[k] for k in sorted(latest)]

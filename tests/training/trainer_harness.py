"""Runs ``scripts/example_transformers.py`` many times from one interpreter, a forked
child per run: transformers takes ten seconds to import, a fork milliseconds.

Run as ``python -m tests.training.trainer_harness --work DIR --plan PLAN.json --out F``.
The plan is a list of runs, each ``{"run_id", "args": [...], "env": {...}}``; they run in
order, each in a child of this process (which imports torch, transformers and burst once
and starts no thread), in ``DIR``. A run's ``"killpoint": [RUN, NAME, N]`` arms
``BURST_KILLPOINT`` at the N-th kill point called NAME that an earlier run (given
``"log_points": true``) reached: a SIGKILL at an exact point of a snapshot's persist. The
children SIGKILL themselves (``BURST_FAULT=kill@...`` or the kill point), exactly like an
OOM killer; the result lists each run's exit code and when it started, as seconds since
the epoch, next to the records the example writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from tests.conftest import ROOT

BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_CODE": "true",
            "MLFLOW_ALLOW_FILE_STORE": "true", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONHASHSEED": "0", "BURST_FREEZE": "0", "DISABLE_TQDM": "1"}


def _load_example():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "example_transformers", ROOT / "scripts" / "example_transformers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _killpoint(work: Path, which: list) -> int:
    run_id, name, nth = which
    seen = 0
    for line in (work / f"{run_id}.points").read_text().splitlines():
        index, point = line.split(" ", 1)
        if point == name or point.endswith("." + name):
            seen += 1
            if seen == nth:
                return int(index)
    raise SystemExit(f"run {run_id} reached {name} only {seen} times")


def run_one(example, work: Path, spec: dict) -> dict:
    """Fork, run the example with ``spec`` in the child, wait; the child's exit code."""
    env = dict(BASE_ENV, **spec.get("env", {}))
    if spec.get("log_points"):
        env["BURST_KILLPOINT_LOG"] = str(work / f"{spec['run_id']}.points")
    if spec.get("killpoint"):
        env["BURST_KILLPOINT"] = str(_killpoint(work, spec["killpoint"]))
    started = time.time()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ.update(env)
            sys.argv = ["example_transformers.py", "--run-id", spec["run_id"],
                        "--store", str(work / "store"),
                        "--records", str(work / f"{spec['run_id']}.jsonl"),
                        "--final", str(work / f"{spec['run_id']}.pt"),
                        "--out", str(work / "out" / spec["run_id"]), *spec.get("args", [])]
            example.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {"run_id": spec["run_id"], "exit": os.waitstatus_to_exitcode(status),
            "started": started, "seconds": time.time() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    os.environ.update(BASE_ENV)
    import torch

    torch.set_num_threads(1)
    example = _load_example()
    import peft  # noqa: F401  (imported once here, not in every child)
    import trl  # noqa: F401

    args.work.mkdir(parents=True, exist_ok=True)
    os.chdir(args.work)
    results = [run_one(example, args.work, spec) for spec in json.loads(args.plan.read_text())]
    args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()

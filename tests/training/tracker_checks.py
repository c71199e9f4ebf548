"""What each tracker holds after a run, read with the tracker's own library (W&B's run
files with its protobuf schema): the steps of one metric, per run."""

from __future__ import annotations

import glob
import os
from collections import Counter
from pathlib import Path

from burst.training.trackers import run_file_steps


def tensorboard_steps(log_dir: Path, tag: str) -> list[int]:
    """The steps of ``tag`` as TensorBoard shows them (purged events dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars(tag)]


def wandb_runs(logs: Path) -> dict[str, list[int]]:
    """Run id -> the history steps of all its offline run files, in file order."""
    runs: dict[str, list[int]] = {}
    for path in sorted(glob.glob(str(logs / "wandb" / "offline-run-*" / "run-*.wandb"))):
        run_id = Path(path).name.removeprefix("run-").removesuffix(".wandb")
        runs.setdefault(run_id, []).extend(run_file_steps(path))
    return runs


def mlflow_runs(tracking_uri: str, experiment: str, key: str) -> dict[str, list[int]]:
    """Run id -> the steps of ``key`` in its metric history."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    return {run.info.run_id: sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            for run in runs}


def once_each(steps: list[int], last: int) -> bool:
    """Every step from 1 to ``last`` exactly once."""
    return Counter(steps) == Counter(range(1, last + 1))

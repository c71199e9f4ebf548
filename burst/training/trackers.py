"""Experiment trackers that continue the same run after a resume: no duplicate, no gap.

A resumed process replays the steps between the snapshot and the crash. Logged again as
they come, they would appear twice (TensorBoard draws both, MLflow keeps both values, W&B
refuses or rewinds once), and what the dead process had logged but its tracker had not
yet stored (W&B holds the tail of a run in memory until a 32 KiB block fills) is lost.
``run.trackers`` keeps, per tracker, its run identity (W&B id, MLflow run id, TensorBoard
directory) and the newest step logged, plus the most recent records (:data:`HISTORY`),
in every snapshot's JSON state. After a resume, here or on a node:

- each tracker reopens the *same* run and says up to which step it really holds records
  (:meth:`Tracker.stored_step`: TensorBoard purges what came after the snapshot, MLflow
  reads its metric history, W&B its own run files offline or the server's step online);
- the records the snapshot holds beyond that are logged again (the gap is closed);
- the training's replayed steps are logged only past what the tracker already holds, and
  since a burst resume is exact they equal what the dead process logged.

::

    run.attach(model, optimizer)
    run.trackers.tensorboard("runs/exp1")         # or .wandb(project=...), .mlflow(...)
    ...
    run.trackers.log({"loss": loss.item()}, step=run.step)
    run.close()                                   # flushes and closes every tracker

Each library is imported only when its tracker is added; none is a dependency of burst.
"""

from __future__ import annotations

import collections
import glob
import math
import os
import struct
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burst.errors import ConfigError

HISTORY = 512  # records kept in each snapshot for re-logging after a resume
STATE_KEY = "burst.trackers"  # where the trackers' state sits in a snapshot's extra state


@dataclass(frozen=True)
class Record:
    """One ``log`` call: the step and the scalar values logged at it."""

    step: int
    values: dict[str, float]


class Tracker:
    """One tracker backend. Subclasses open their run in :meth:`open`, write records in
    :meth:`write` and say what they already hold in :meth:`stored_step`."""

    name = ""

    def __init__(self) -> None:
        self.last_step: int | None = None  # the newest step written (or found stored)

    def open(self, saved: Mapping[str, Any] | None) -> None:
        """Open the run: a new one, or with ``saved`` (this tracker's snapshot state) the
        same run again."""
        raise NotImplementedError

    def stored_step(self, saved: Mapping[str, Any]) -> int | None:
        """After a resume: the newest step this tracker's own record holds (None: it holds
        exactly what the snapshot says was logged)."""
        return None

    def write(self, record: Record) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """What reopens the same run (JSON), plus the newest step logged."""
        return {"last_step": self.last_step}

    def close(self) -> None:
        """Flush and finish (the run stays resumable)."""


class Trackers:
    """The run's trackers: ``run.trackers``. Add them after ``run.attach`` (which tells
    them where the run resumed); log with :meth:`log`."""

    def __init__(self) -> None:
        self._trackers: dict[str, Tracker] = {}
        self._saved: dict[str, Any] = {}
        self._history: collections.deque[Record] = collections.deque(maxlen=HISTORY)
        self._floor: dict[str, int | None] = {}  # per tracker: skip steps up to this one

    def __bool__(self) -> bool:
        return bool(self._trackers)

    def __contains__(self, name: object) -> bool:
        return name in self._trackers

    # -- adding trackers ------------------------------------------------------------------

    def tensorboard(self, log_dir: str | os.PathLike[str], **writer_args: Any) -> Any:
        """A TensorBoard ``SummaryWriter`` (``torch.utils.tensorboard``) on ``log_dir``;
        resumed, on the directory the run first used, with ``purge_step`` so the
        replayed steps replace the dead process's."""
        return self._add(TensorBoard(log_dir, writer_args)).writer

    def wandb(self, **init_args: Any) -> Any:
        """A W&B run (``wandb.init(**init_args)``, online or ``WANDB_MODE=offline``);
        resumed, the same run id with ``resume="allow"``. Returns the ``wandb`` run."""
        return self._add(WandB(init_args)).run

    def mlflow(self, tracking_uri: str | None = None, experiment: str | None = None,
               run_name: str | None = None) -> str:
        """An MLflow run (any tracking URI: a server, ``sqlite:///...``, a file store);
        resumed, the same run id. Returns the run id."""
        return self._add(MLflow(tracking_uri, experiment, run_name)).run_id

    def add(self, tracker: Tracker) -> Tracker:
        """A tracker of your own (a :class:`Tracker` subclass)."""
        return self._add(tracker)

    def _add(self, tracker: Tracker) -> Any:
        if not tracker.name:
            raise ConfigError("a tracker needs a name")
        if tracker.name in self._trackers:
            raise ConfigError(f"the run already has a {tracker.name} tracker")
        saved = self._saved.get(tracker.name)
        tracker.open(saved)
        self._trackers[tracker.name] = tracker
        if saved is None:
            self._floor[tracker.name] = None
            return tracker
        logged = saved.get("last_step")
        stored = tracker.stored_step(saved)
        holds = logged if stored is None else stored
        for record in self._history:  # what the tracker lost: logged again, in order
            if (holds is None or record.step > holds) and \
                    (logged is None or record.step <= logged):
                tracker.write(record)
        known = [step for step in (logged, stored) if step is not None]
        tracker.last_step = self._floor[tracker.name] = max(known) if known else None
        return tracker

    # -- logging --------------------------------------------------------------------------

    def log(self, values: Mapping[str, Any], step: int) -> None:
        """Log scalar ``values`` at ``step`` to every tracker. A step a tracker already
        holds (replayed after a resume) is not logged to it again."""
        record = Record(int(step), _scalars(values))
        if not record.values:
            return
        self._history.append(record)
        for name, tracker in self._trackers.items():
            floor = self._floor.get(name)
            if floor is not None and record.step <= floor:
                continue
            tracker.write(record)
            tracker.last_step = record.step

    # -- snapshot state -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The JSON state a snapshot keeps (each tracker's, and the recent records)."""
        trackers = {**self._saved, **{n: t.state() for n, t in self._trackers.items()}}
        return {"trackers": trackers,
                "history": [[r.step, r.values] for r in self._history]}

    def restore(self, saved: Mapping[str, Any] | None) -> None:
        """At ``attach``: the state of the snapshot restored (None: a new run)."""
        if self._trackers:
            raise ConfigError("add trackers after run.attach(): it says where the run resumes")
        if not saved:
            return
        self._saved = dict(saved.get("trackers") or {})
        self._history.clear()
        for step, values in saved.get("history") or []:
            self._history.append(Record(int(step), dict(values)))

    def close(self) -> None:
        for tracker in self._trackers.values():
            tracker.close()


def _scalars(values: Mapping[str, Any]) -> dict[str, float]:
    """The values a tracker can chart: numbers (tensors of one element included)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[str(key)] = float(value)
    return out


class TensorBoard(Tracker):
    """TensorBoard event files. Every record is flushed as it is written, so a killed
    process's events are on disk; the resumed writer's ``purge_step`` makes readers drop
    the events past the snapshot's newest step, which the resumed run logs again."""

    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str], writer_args: Mapping[str, Any]) -> None:
        super().__init__()
        self.log_dir = str(log_dir)
        self.writer_args = dict(writer_args)
        self.writer: Any = None

    def open(self, saved: Mapping[str, Any] | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = None
        if saved is not None:
            self.log_dir = str(saved.get("log_dir") or self.log_dir)
            last = saved.get("last_step")
            purge = None if last is None else int(last) + 1
        self.writer = SummaryWriter(self.log_dir, purge_step=purge, **self.writer_args)

    def write(self, record: Record) -> None:
        for key, value in record.values.items():
            self.writer.add_scalar(key, value, record.step)
        self.writer.flush()

    def state(self) -> dict[str, Any]:
        return {**super().state(), "log_dir": self.log_dir}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class MLflow(Tracker):
    """An MLflow run through ``MlflowClient`` (no global active run is touched). MLflow
    stores each batch as it is sent, so after a resume its metric history says how far
    the dead process got."""

    name = "mlflow"

    def __init__(self, tracking_uri: str | None, experiment: str | None,
                 run_name: str | None) -> None:
        super().__init__()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.run_id = ""
        self.keys: set[str] = set()
        self._client: Any = None

    def open(self, saved: Mapping[str, Any] | None) -> None:
        from mlflow.tracking import MlflowClient

        if saved is not None:
            self.tracking_uri = saved.get("tracking_uri") or self.tracking_uri
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        if saved is not None and saved.get("run_id"):
            self.run_id = str(saved["run_id"])
            self.keys = set(saved.get("keys") or [])
            self._client.update_run(self.run_id, status="RUNNING")
            return
        experiment_id = "0"
        if self.experiment:
            found = self._client.get_experiment_by_name(self.experiment)
            experiment_id = found.experiment_id if found else \
                self._client.create_experiment(self.experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=self.run_name).info.run_id

    def stored_step(self, saved: Mapping[str, Any]) -> int | None:
        steps = [m.step for key in sorted(self.keys)
                 for m in self._client.get_metric_history(self.run_id, key)]
        return max(steps) if steps else -1

    def write(self, record: Record) -> None:
        import time

        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[
            Metric(key, value, stamp, record.step) for key, value in record.values.items()
            if math.isfinite(value)])
        self.keys.update(record.values)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "run_id": self.run_id, "tracking_uri": self.tracking_uri,
                "keys": sorted(self.keys)}

    def close(self) -> None:
        if self._client is not None and self.run_id:
            self._client.set_terminated(self.run_id)


class WandB(Tracker):
    """A W&B run. W&B writes a run's records in 32 KiB blocks and loses the unwritten
    tail when the process is killed, online or offline, so the resumed run asks what it
    really holds: offline, the run files of earlier processes in the same directory;
    online, the server's step of the resumed run."""

    name = "wandb"

    def __init__(self, init_args: Mapping[str, Any]) -> None:
        super().__init__()
        self.init_args = dict(init_args)
        self.run: Any = None

    def open(self, saved: Mapping[str, Any] | None) -> None:
        import wandb

        args = dict(self.init_args)
        if saved is not None:
            args.setdefault("dir", saved.get("dir"))
            args.setdefault("project", saved.get("project"))
        args["id"] = (saved or {}).get("id") or args.get("id") or uuid.uuid4().hex[:12]
        args["resume"] = "allow"
        self.run = wandb.init(**{k: v for k, v in args.items() if v is not None})
        self.init_args = args

    def stored_step(self, saved: Mapping[str, Any]) -> int | None:
        if not self.run.offline:
            return self.run.step - 1 if self.run.step else -1
        steps = [step for path in self._earlier_files() for step in run_file_steps(path)]
        return max(steps) if steps else -1

    def _earlier_files(self) -> list[str]:
        """The run files other processes wrote for this run id (offline mode)."""
        here = Path(self.run.dir).parent
        pattern = str(here.parent / f"offline-run-*-{self.run.id}" / f"run-{self.run.id}.wandb")
        return [p for p in sorted(glob.glob(pattern)) if Path(p).parent != here]

    def write(self, record: Record) -> None:
        self.run.log(record.values, step=record.step)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "id": self.init_args.get("id"),
                "project": self.init_args.get("project"), "dir": self.init_args.get("dir")}

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


def run_file_steps(path: str | os.PathLike[str]) -> list[int]:
    """The history steps a W&B run file (``run-<id>.wandb``) holds, in order.

    wandb 0.31 has no Python reader for its own transaction log any more; its format is
    LevelDB's log (32 KiB blocks of CRC'd, typed fragments) of protobuf ``Record``
    messages, whose schema wandb ships (``wandb.proto.wandb_internal_pb2``)."""
    from wandb.proto import wandb_internal_pb2

    steps = []
    for raw in _leveldb_records(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
        except Exception:  # a torn tail: what was stored ends here
            break
        if record.WhichOneof("record_type") == "history":
            steps.append(int(record.history.step.num))
    return steps


_WANDB_HEADER = 7  # ":W&B", a 2-byte magic, a version byte
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _leveldb_records(data: bytes) -> Iterator[bytes]:
    pos, pending = _WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length:
            return  # torn
        pos += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk

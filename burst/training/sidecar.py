"""What runs beside a run's training, never in its way: the metrics it logs (for
``burst report``), the live figures an agent's exporter reads (``burst run
--metrics-port``), and the pre-staging of what a node will need (``burst.env.stager``).

Each is worth less than the run, so each is best effort, and all of it starts only once
the run attached (a refused attach leaves no thread behind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from burst.env import freeze, stager
from burst.snapshot.upload import UploadQueue
from burst.store import Store
from burst.training.layout import Layout
from burst.training.metrics import LiveFigures, MetricBuffer


class Sidecar:
    """Metrics, live figures and pre-staging of one run on one rank."""

    def __init__(self, store: Store, local: Store, run_id: str, rank: int, writer: bool,
                 record: Callable[..., None]) -> None:
        self.store, self.local, self.run_id = store, local, run_id
        self._rank, self._writer = rank, writer
        self.live = LiveFigures(run_id)  # for the agent's exporter, if it asked
        self._publishing = writer and self.live.enabled  # asked once
        self.stager: stager.Stager | None = None  # pre-staging
        self.metrics = MetricBuffer(lambda points: record(MetricBuffer.EVENT, points=points))

    def start(self) -> None:
        """Once attached (nothing left to refuse): the threads that upload to the store."""
        # environment + code, in a thread (fork-safe: burst.staging.spawn); snapshots wait boundedly
        freeze.prefetch(self.store, self.run_id, local=self.local)
        if self._rank == 0 and self.stager is None:  # the rest, throttled behind snapshots
            self.stager = stager.for_run(self.store, self.run_id, self.local, self.live.readiness)

    def stop_staging(self) -> None:
        """Returns at once: a final or emergency snapshot has the uplink to itself."""
        if self.stager is not None:
            self.stager.stop()

    def step_done(self, step: int, samples: int, layout: Layout,
                  uploads: UploadQueue | None) -> None:
        """For ``burst run --metrics-port`` (rank 0, when the agent asked)."""
        if not self._publishing:
            return
        uploading = None if uploads is None else uploads.busy()
        reserved = torch.cuda.memory_reserved() if torch.cuda.is_initialized() else None
        self.live.step_done(step, samples, layout.micro_batch, layout.accumulation,
                            uploading, reserved)

    def logged(self, step: int, samples_consumed: int, values: dict[str, Any]) -> None:
        """``run.log``: buffered, written with the next snapshot (rank 0 only)."""
        if self._writer:
            self.metrics.add(step, samples_consumed, values)
            self.live.logged(values)

    def committed(self, manifest: dict) -> None:
        """A snapshot is stored: the metrics logged up to it go with it."""
        self.metrics.flush()
        self.live.committed(manifest)

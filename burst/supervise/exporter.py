"""Prometheus metrics for a supervised run (``burst run --metrics-port N``).

The exporter lives in the agent, so it outlasts the training process it watches: a
crashed or restarted child still shows up as failures and restarts. Its figures come
from three places, each read only when Prometheus scrapes:

- the GPU watch's newest NVML reading (memory, utilisation, temperature, ECC, Xid); a
  machine without NVML exports no GPU series at all rather than made-up zeros;
- the child's latest figures, a small JSON file it rewrites atomically at most once a
  second in the directory the agent gives it (``burst.training.metrics.LiveFigures``);
- the agent's own attempts (failures by kind, restarts, pauses) and its machine share
  (the GPU memory quota).

A series whose source has no value yet (no snapshot so far, no remote store, so no upload
backlog) is left out. The server binds to 127.0.0.1 unless told otherwise: the figures
are not secret, but nothing on the network needs to reach them by default.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from burst.contract import Reason, StateSource
from burst.supervise.agent import Agent
from burst.supervise.goodput import MembershipFeed
from burst.supervise.gpuwatch import GpuWatch
from burst.training.metrics import FIGURES_ENV, FIGURES_FILE

Family = GaugeMetricFamily | CounterMetricFamily  # the kinds this exporter fills

GPU_LABELS = ["gpu", "name"]
# name: (help, field of GpuSample, scale); gauges, one per GPU
GPU_GAUGES = {
    "burst_gpu_memory_used_bytes": ("GPU memory in use (NVML)", "memory_used", 1),
    "burst_gpu_memory_total_bytes": ("GPU memory on the card (NVML)", "memory_total", 1),
    "burst_gpu_utilization_ratio": ("GPU busy fraction over NVML's last sample period",
                                    "utilization", 0.01),
    "burst_gpu_temperature_celsius": ("GPU core temperature", "temperature", 1),
}
GPU_ECC = "burst_gpu_ecc_uncorrected_errors"
GPU_XID = "burst_gpu_xid_errors"
# name: (help, key in the child's figures file); gauges, one per run
RUN_GAUGES = {
    "burst_step": ("Optimizer steps completed", "step"),
    "burst_step_seconds": ("Wall time of the last optimizer step", "step_seconds"),
    "burst_samples_per_second": ("Samples per second over the last step", "samples_per_second"),
    "burst_loss": ("The loss the script last passed to run.log", "logged_loss"),
    "burst_micro_batch": ("Micro-batch size in force", "micro_batch"),
    "burst_accumulation_steps": ("Gradient accumulation steps in force", "accumulation"),
    "burst_upload_backlog_bytes": ("Bytes of the committed snapshot not yet in the remote "
                                   "store (all its blobs: an upper bound)",
                                   "upload_backlog_bytes"),
    "burst_ready_bytes_pending": ("Bytes a burst would still upload before the node could "
                                  "start, snapshots aside (burst.env.readiness)",
                                  "ready_bytes_pending"),
    "burst_ready_objects_pending": ("Objects (wheels, archives, inputs) the store still lacks",
                                    "ready_objects_pending"),
    "burst_ready_upload_seconds": ("Seconds those bytes take at the measured uplink",
                                   "ready_upload_seconds"),
    "burst_ready_setup_seconds": ("Estimated seconds the node then needs to set up",
                                  "ready_setup_seconds"),
    "burst_uplink_bytes_per_second": ("Uplink the snapshot uploads measured",
                                      "uplink_bytes_per_second"),
    "burst_quota_bytes": ("GPU memory quota of the run (burst run --gpu-memory-quota)",
                          "quota_bytes"),
    "burst_quota_used_bytes": ("GPU memory PyTorch's allocator holds in the run (what its "
                               "quota caps)", "memory_reserved"),
}
SNAPSHOT_AGE = "burst_snapshot_age_seconds"
FIGURES_AGE = "burst_figures_age_seconds"
FAILURES = "burst_failures"
RESTARTS = "burst_restarts"
PAUSES = "burst_pauses"
# goodput: what the run's membership changes cost (burst.contract.MembershipChange)
CHANGES = "burst_membership_changes"
STEPS_LOST = "burst_membership_steps_lost"
SECONDS_LOST = "burst_membership_seconds_to_step"
LAST_SECONDS = "burst_membership_last_seconds_to_step"
WORLD_SIZE = "burst_world_size"
ENDED_WELL = ("ok", Reason.SIGNAL)  # the rest are failures (a pause is neither)


class BurstCollector(Collector):
    """Builds every series afresh at each scrape from the watch, the figures file and the
    agent's attempts (read, never changed)."""

    def __init__(self, run_id: str, figures_dir: Path, watch: GpuWatch | None = None,
                 agent: Agent | None = None) -> None:
        self.run_id, self.figures_dir = run_id, Path(figures_dir)
        self.watch, self.agent = watch, agent
        self.membership = None if agent is None else MembershipFeed(agent.store, run_id)

    def describe(self) -> Iterator[Metric]:
        """Every family the exporter can export (empty): what the registry knows by name."""
        yield from self._families().values()

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        self._add_gpus(families)
        self._add_run(families, self.figures())
        self._add_attempts(families)
        self._add_membership(families)
        yield from (family for family in families.values() if family.samples)

    def figures(self) -> dict[str, Any]:
        """The child's latest figures; {} before its first step (or if unreadable)."""
        try:
            figures = json.loads((self.figures_dir / FIGURES_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return figures if isinstance(figures, dict) else {}

    def _families(self) -> dict[str, Family]:
        families: dict[str, Family] = {
            name: GaugeMetricFamily(name, text, labels=GPU_LABELS)
            for name, (text, _, _) in GPU_GAUGES.items()}
        families[GPU_ECC] = CounterMetricFamily(GPU_ECC, "Uncorrected ECC errors (aggregate)",
                                                labels=GPU_LABELS)
        families[GPU_XID] = CounterMetricFamily(GPU_XID, "Critical Xid errors seen by this "
                                                "agent", labels=["gpu"])
        for name, (text, _) in RUN_GAUGES.items():
            families[name] = GaugeMetricFamily(name, text, labels=["run_id"])
        families[SNAPSHOT_AGE] = GaugeMetricFamily(
            SNAPSHOT_AGE, "Seconds since the newest snapshot was persisted", labels=["run_id"])
        families[FIGURES_AGE] = GaugeMetricFamily(
            FIGURES_AGE, "Seconds since the training process last published figures",
            labels=["run_id"])
        families[FAILURES] = CounterMetricFamily(FAILURES, "Attempts that ended in a failure, "
                                                 "by kind", labels=["run_id", "kind"])
        families[RESTARTS] = CounterMetricFamily(RESTARTS, "Times the agent started the "
                                                 "training process again", labels=["run_id"])
        families[PAUSES] = CounterMetricFamily(PAUSES, "Attempts that paused for a "
                                               "higher-priority run", labels=["run_id"])
        families[CHANGES] = CounterMetricFamily(
            CHANGES, "Changes of the run's membership (restarts, shrinks, grows), by where "
            "the state came from", labels=["run_id", "state_from"])
        families[STEPS_LOST] = CounterMetricFamily(
            STEPS_LOST, "Optimizer steps thrown away by membership changes (known to the "
            "history: a lower bound)", labels=["run_id"])
        families[SECONDS_LOST] = CounterMetricFamily(
            SECONDS_LOST, "Seconds from each loss to the next optimizer step, summed",
            labels=["run_id"])
        families[LAST_SECONDS] = GaugeMetricFamily(
            LAST_SECONDS, "Seconds from the latest loss to the next optimizer step",
            labels=["run_id"])
        families[WORLD_SIZE] = GaugeMetricFamily(
            WORLD_SIZE, "Ranks training after the latest membership change", labels=["run_id"])
        return families

    def _add_gpus(self, families: dict[str, Family]) -> None:
        if self.watch is None or not self.watch.available:
            return  # no NVML: no GPU series, never zeros that look like a reading
        for sample in self.watch.latest:
            labels = [str(sample.index), sample.name]
            for name, (_, field, scale) in GPU_GAUGES.items():
                _add(families[name], labels, getattr(sample, field), scale)
            _add(families[GPU_ECC], labels, sample.ecc_uncorrected)
        for gpu, count in self.watch.xid_counts.items():
            families[GPU_XID].add_metric(["unknown" if gpu is None else str(gpu)], count)

    def _add_run(self, families: dict[str, Family], figures: dict[str, Any]) -> None:
        labels = [self.run_id]
        for name, (_, key) in RUN_GAUGES.items():
            _add(families[name], labels, figures.get(key))
        now = time.time()
        for name, key in ((SNAPSHOT_AGE, "snapshot_time"), (FIGURES_AGE, "time")):
            if isinstance(figures.get(key), (int, float)):
                families[name].add_metric(labels, max(0.0, now - figures[key]))

    def _add_attempts(self, families: dict[str, Family]) -> None:
        if self.agent is None:
            return
        attempts = list(self.agent.attempts)
        kinds: dict[str, int] = {}
        for attempt in attempts:
            if attempt.kind not in ENDED_WELL and not attempt.paused:
                kinds[attempt.kind] = kinds.get(attempt.kind, 0) + 1
        for kind, count in sorted(kinds.items()):
            families[FAILURES].add_metric([self.run_id, kind], count)
        pauses = sum(attempt.paused for attempt in attempts)
        # a start after a pause is a resume the run asked for, not a restart
        families[RESTARTS].add_metric([self.run_id], max(0, self.agent.starts - 1 - pauses))
        families[PAUSES].add_metric([self.run_id], pauses)
        if self.agent.share is not None:
            families["burst_quota_bytes"].add_metric([self.run_id], self.agent.share.quota)


    def _add_membership(self, families: dict[str, Family]) -> None:
        if self.membership is None:
            return
        changes = self.membership.changes()
        labels = [self.run_id]
        for source in StateSource:  # every source, zero included: a rate needs the series
            count = sum(1 for c in changes if c.state_from is source)
            families[CHANGES].add_metric([self.run_id, str(source)], count)
        families[STEPS_LOST].add_metric(labels, sum(c.steps_lost or 0 for c in changes))
        families[SECONDS_LOST].add_metric(labels, sum(c.seconds_to_step or 0.0
                                                      for c in changes))
        if changes:
            _add(families[LAST_SECONDS], labels, changes[-1].seconds_to_step)
            families[WORLD_SIZE].add_metric(labels, changes[-1].world_after)


def _add(family: Family, labels: list[str], value: Any, scale: float = 1) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        family.add_metric(labels, value * scale)


def metric_names(collector: BurstCollector) -> set[str]:
    """The sample names the collector can export (a counter ``x`` is scraped as
    ``x_total``): what a dashboard or a rule may refer to."""
    names = set()
    for family in collector.describe():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


class Exporter:
    """The HTTP server and the figures directory of one supervised run."""

    def __init__(self, run_id: str, port: int, addr: str = "127.0.0.1",
                 watch: GpuWatch | None = None, agent: Agent | None = None) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="burst-metrics-")
        self.figures_dir = Path(self._directory.name)
        self.collector = BurstCollector(run_id, self.figures_dir, watch, agent)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self.server, self.thread = start_http_server(port, addr, registry=registry)
        except OSError:
            self._directory.cleanup()
            raise

    @property
    def env(self) -> dict[str, str]:
        """What the training process needs in its environment to publish its figures."""
        return {FIGURES_ENV: str(self.figures_dir)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._directory.cleanup()

"""The Prometheus exporter of ``burst run --metrics-port``: its collector in-process, the
shipped rules and dashboard against what it exports, and a real Prometheus server scraping
a real supervised CPU run on loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from burst.contract import ENV_FAULT
from burst.supervise.exporter import BurstCollector, metric_names
from burst.supervise.gpuwatch import GpuSample, GpuWatch
from burst.training.metrics import LiveFigures
from tests.conftest import EXAMPLE, ROOT
from tests.helpers.store_servers import free_port

RULES = ROOT / "templates" / "prometheus" / "burst-rules.yml"
DASHBOARD = ROOT / "templates" / "grafana" / "burst-dashboard.json"
SERIES = re.compile(r"\bburst_[a-z_]+\b")


def exported(tmp_path: Path) -> set[str]:
    return metric_names(BurstCollector("r", tmp_path))


def samples(collector: BurstCollector) -> dict[str, float]:
    return {sample.name: sample.value for family in collector.collect()
            for sample in family.samples}


def test_dashboard_loads_and_names_only_exported_series(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    named = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in SERIES.findall(target["expr"])}
    assert named and named <= exported(tmp_path), named - exported(tmp_path)


def test_alert_rules_name_only_exported_series(tmp_path):
    named = set(SERIES.findall(RULES.read_text())) - {"burst_rules"}
    assert {"burst_gpu_memory_used_bytes", "burst_snapshot_age_seconds",
            "burst_upload_backlog_bytes"} <= named
    assert named <= exported(tmp_path), named - exported(tmp_path)


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/test.sh installs Debian's prometheus)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_live_figures_publish_at_most_once_a_second(tmp_path):
    now = [100.0]
    live = LiveFigures("r", str(tmp_path), clock=lambda: now[0])
    collector = BurstCollector("r", tmp_path)
    live.logged({"loss": 2.5})
    live.step_done(1, 8, micro_batch=4, accumulation=2, uploading=None)
    now[0] += 0.5
    live.step_done(2, 8, micro_batch=4, accumulation=2, uploading=None)
    assert collector.figures()["step"] == 1  # the second step fell inside the second
    now[0] += 0.5
    live.step_done(3, 8, micro_batch=4, accumulation=2, uploading=None)
    found = samples(collector)
    assert found["burst_step"] == 3 and found["burst_loss"] == 2.5
    assert found["burst_step_seconds"] == 0.5 and found["burst_samples_per_second"] == 16
    assert found["burst_micro_batch"] == 4 and found["burst_accumulation_steps"] == 2


def test_series_without_a_source_are_left_out_not_zeroed(tmp_path):
    watch = GpuWatch(lambda *_, **__: None)
    if watch.start():
        watch.stop()
        pytest.skip("this machine has NVML: its GPU series are real")
    live = LiveFigures("r", str(tmp_path))
    live.step_done(1, 8, micro_batch=8, accumulation=1, uploading=None)
    names = set(samples(BurstCollector("r", tmp_path, watch=watch)))
    assert "burst_step" in names
    assert not {n for n in names if n.startswith("burst_gpu_")}
    assert not names & {"burst_snapshot_age_seconds", "burst_upload_backlog_bytes",
                        "burst_loss", "burst_quota_bytes"}


class OneCardNvml:
    """Stands in for the NVML library only (no GPU here): the watch and collector run."""

    def sample(self) -> list[GpuSample]:
        return [GpuSample(0, "H200", memory_used=60 << 30, memory_total=140 << 30,
                          utilization=75, temperature=61, ecc_uncorrected=2)]

    def __init__(self) -> None:
        self.xids = [{"xid": 79, "event_type": 8, "gpu": 0}]  # reported once

    def xid_events(self) -> list[dict]:
        found, self.xids = self.xids, []
        return found

    def close(self) -> None:
        pass


def test_gpu_series_are_the_watchs_newest_nvml_reading(tmp_path):
    watch = GpuWatch(lambda *_, **__: None, interval=3600, reader=OneCardNvml)
    assert watch.start()
    watch.stop()  # its thread has polled at most once; the reading below is the newest
    watch.poll(0.0)
    found = {(s.name, s.labels.get("gpu")): s.value
             for family in BurstCollector("r", tmp_path, watch=watch).collect()
             for s in family.samples}
    assert found[("burst_gpu_memory_used_bytes", "0")] == 60 << 30
    assert found[("burst_gpu_memory_total_bytes", "0")] == 140 << 30
    assert found[("burst_gpu_utilization_ratio", "0")] == 0.75
    assert found[("burst_gpu_temperature_celsius", "0")] == 61
    assert found[("burst_gpu_ecc_uncorrected_errors_total", "0")] == 2
    assert found[("burst_gpu_xid_errors_total", "0")] == 1


def test_upload_backlog_is_the_committed_snapshot_until_it_is_uploaded(tmp_path):
    live = LiveFigures("r", str(tmp_path), clock=iter(range(100)).__next__)
    collector = BurstCollector("r", tmp_path)
    live.committed({"step": 3, "blobs": {"a": {"size": 1000}, "b": {"size": 24}}})
    live.step_done(3, 8, micro_batch=8, accumulation=1, uploading=True)
    assert samples(collector)["burst_upload_backlog_bytes"] == 1024
    assert samples(collector)["burst_snapshot_age_seconds"] >= 0
    live.step_done(4, 8, micro_batch=8, accumulation=1, uploading=False)
    assert samples(collector)["burst_upload_backlog_bytes"] == 0


# -- a real Prometheus scraping a real run ---------------------------------------------


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]["result"]


def start_prometheus(tmp_path: Path, target_port: int) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        pytest.skip("prometheus is not installed (scripts/test.sh installs Debian's package)")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: burst\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    return server, port


def stop_both(run: subprocess.Popen | None, prometheus: subprocess.Popen) -> None:
    """End a scraped run the way a user would (SIGTERM: the agent forwards it, the run
    snapshots and stops), then its Prometheus."""
    if run is not None and run.poll() is None:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    prometheus.terminate()
    prometheus.wait(timeout=30)


def wait_for(found, server: subprocess.Popen, deadline_s: float = 60.0):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"exited with {server.returncode}")
        try:
            result = found()
        except (urllib.error.URLError, ConnectionError):
            result = None
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError("timed out")


@pytest.mark.e2e
def test_prometheus_scrapes_step_time_micro_batch_and_loss_of_a_run(tmp_path):
    metrics_port = free_port()
    prometheus, port = start_prometheus(tmp_path, metrics_port)
    run = None
    try:
        wait_for(lambda: query(port, "vector(1)"), prometheus)  # its API answers
        run = subprocess.Popen(
            [sys.executable, "-m", "burst.cli", "run", "--run-id", "scraped", "--store",
             str(tmp_path / "store"), "--metrics-port", str(metrics_port), "--",
             sys.executable, str(EXAMPLE), "--samples", "64", "--epochs", "100000",
             "--persist-every", "50", "--micro-batch", "4"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "run.log").open("w"))
        series = wait_for(lambda: all(query(port, name) for name in (
            "burst_step_seconds", "burst_micro_batch", "burst_loss")) and {
            name: query(port, name) for name in (
                "burst_step_seconds", "burst_micro_batch", "burst_accumulation_steps",
                "burst_loss")}, run)
    finally:
        stop_both(run, prometheus)
    micro = series["burst_micro_batch"][0]
    assert micro["metric"]["run_id"] == "scraped" and micro["metric"]["job"] == "burst"
    assert float(micro["value"][1]) == 4
    assert float(series["burst_accumulation_steps"][0]["value"][1]) == 4  # 16 / 4
    assert float(series["burst_step_seconds"][0]["value"][1]) > 0
    assert float(series["burst_loss"][0]["value"][1]) > 0
    assert run.returncode == 88, (tmp_path / "run.log").read_text()[-2000:]


def test_failures_by_kind_and_restarts_come_from_the_agents_attempts(tmp_path):
    from burst.store import open_store
    from burst.supervise.agent import Agent, Policy

    store = tmp_path / "store"
    agent = Agent([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                  run_id="r", store=open_store(str(store)), store_url=str(store),
                  policy=Policy(on_killed="restart", max_retries=1), say=lambda _: None)
    assert agent.run().decision == "stop"
    found = {(s.name, s.labels.get("kind")): s.value
             for family in BurstCollector("r", tmp_path, agent=agent).collect()
             for s in family.samples}
    assert found[("burst_failures_total", "killed")] == 2
    assert found[("burst_restarts_total", None)] == 1
    assert found[("burst_pauses_total", None)] == 0
    assert ("burst_quota_bytes", None) not in found  # no --gpu-memory-quota


@pytest.mark.e2e
def test_prometheus_scrapes_the_cost_of_a_restart_from_the_store(tmp_path):
    metrics_port = free_port()
    prometheus, port = start_prometheus(tmp_path, metrics_port)
    run = None
    try:
        wait_for(lambda: query(port, "vector(1)"), prometheus)
        run = subprocess.Popen(
            [sys.executable, "-m", "burst.cli", "run", "--run-id", "restarted", "--store",
             str(tmp_path / "store"), "--metrics-port", str(metrics_port), "--on-killed",
             "restart", "--", sys.executable, str(EXAMPLE), "--samples", "64", "--epochs",
             "100000", "--persist-every", "2", "--micro-batch", "4"],
            env={**os.environ, ENV_FAULT: "kill@5"},  # SIGKILL in step 5, once per run
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "run.log").open("w"))
        changes = wait_for(lambda: query(port, 'burst_membership_changes_total'
                                               '{state_from="store"} > 0'), run)
        series = {name: query(port, name) for name in (
            "burst_membership_changes_total", "burst_membership_seconds_to_step_total",
            "burst_world_size")}
    finally:
        stop_both(run, prometheus)
    assert float(changes[0]["value"][1]) == 1
    assert changes[0]["metric"]["run_id"] == "restarted"
    by_source = {s["metric"]["state_from"]: float(s["value"][1])
                 for s in series["burst_membership_changes_total"]}
    assert by_source == {"ram": 0, "peer": 0, "store": 1}
    assert float(series["burst_membership_seconds_to_step_total"][0]["value"][1]) > 0
    assert float(series["burst_world_size"][0]["value"][1]) == 1


def test_the_membership_feed_reads_only_whole_new_lines(tmp_path):
    from burst import events
    from burst.contract import MembershipChange, StateSource
    from burst.store import LocalStore
    from burst.supervise.goodput import MembershipFeed

    store = LocalStore(tmp_path / "store")
    feed = MembershipFeed(store, "r")
    assert feed.changes() == []
    change = MembershipChange(step=4, state_from=StateSource.STORE, world_after=2,
                              world_before=3, steps_lost=1, seconds_to_step=2.5, cause="killed")
    events.append(store, "r", "membership-change", **change.to_event())
    line = json.dumps({"time": "2026-01-01T00:00:00+00:00", "event": "membership-change",
                       **change.to_event()})
    store.append(events.key("r"), line[:40].encode())  # a write still under way
    assert feed.changes() == [change]
    store.append(events.key("r"), (line[40:] + "\n").encode())
    store.append(events.key("r"), b'{"event": "membership-change", "step": "four"}\n')
    assert feed.changes() == [change, change]

"""Readiness as a person and Prometheus see it: ``burst status`` (table and --json), the
``burst check`` row, and the exporter's gauges, scraped by a real Prometheus from a real run
that pre-stages to a real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from burst.cli import main as cli_main
from burst.env import readiness
from burst.preflight.readiness import readiness_row
from burst.preflight.table import OK, WARN
from burst.staging.parts import Pending
from burst.store.local import LocalStore
from burst.supervise.exporter import BurstCollector
from burst.training.metrics import LiveFigures
from tests.conftest import EXAMPLE, ROOT
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, free_port
from tests.supervise.test_exporter import query, samples, start_prometheus, stop_both, wait_for

WAITING = [Pending("code", 1, 3_000_000), Pending("wheelhouse", 4, 12_000_000)]


def published(store, pendings, uplink=3.75e6) -> readiness.Readiness:
    ready = readiness.estimate(pendings, uplink, wheel_bytes=500_000_000)
    readiness.save(store, "run", ready)
    return ready


def test_the_sentence_says_what_is_left_how_long_it_takes_and_the_nodes_set_up():
    line = readiness.estimate(WAITING, 3.75e6, 500_000_000).line()
    assert line.startswith("if the GPU failed now: 15.0 MB still to upload")
    assert "about 4 s at 30.0 Mbit/s" in line and "code 3.0 MB" in line
    assert line.endswith(f"about {readiness.setup_seconds(500_000_000):.0f} s to set up")


def test_the_set_up_estimate_grows_with_the_wheelhouse():
    assert readiness.setup_seconds(0) == readiness.BOOT_SECONDS
    assert readiness.setup_seconds(3_500_000_000) > readiness.setup_seconds(500_000_000)


def test_burst_status_shows_the_published_readiness_as_a_row_and_in_json(tmp_path):
    store = LocalStore(tmp_path / "store")
    take(store, 1)
    published(store, WAITING)
    runner = CliRunner()
    shown = runner.invoke(cli_main, ["status", "run", "--store", store.url, "--json"])
    assert shown.exit_code == 0, shown.output
    ready = json.loads(shown.output)["readiness"]
    assert ready["pending_bytes"] == 15_000_000 and ready["ready"] is False
    table = runner.invoke(cli_main, ["status", "run", "--store", store.url],
                          env={"COLUMNS": "300"})
    assert "if the GPU failed now: 15.0 MB still to upload" in table.output


def test_the_check_row_warns_while_something_is_left_and_passes_once_staged(tmp_path):
    store = LocalStore(tmp_path / "store")
    published(store, WAITING)
    row = readiness_row(store, None, "run")
    assert row.status == WARN and "15.0 MB still to upload" in row.detail and not row.required
    published(store, [Pending("code"), Pending("wheelhouse")])
    assert readiness_row(store, None, "run").status == OK


def test_the_exporter_exports_the_stagers_readiness(tmp_path):
    live = LiveFigures("r", str(tmp_path), clock=iter(range(100)).__next__)
    live.readiness(readiness.estimate(WAITING, 3.75e6, 500_000_000))
    live.step_done(1, 8, micro_batch=8, accumulation=1, uploading=None)
    found = samples(BurstCollector("r", tmp_path))
    assert found["burst_ready_bytes_pending"] == 15_000_000
    assert found["burst_ready_objects_pending"] == 5
    assert found["burst_ready_upload_seconds"] == pytest.approx(4.0)
    assert found["burst_uplink_bytes_per_second"] == 3.75e6
    assert found["burst_ready_setup_seconds"] > readiness.BOOT_SECONDS


@pytest.mark.e2e
def test_prometheus_sees_readiness_fall_to_zero_as_a_run_pre_stages(tmp_path, moto_s3):
    metrics_port = free_port()
    prometheus, port = start_prometheus(tmp_path, metrics_port)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": "us-east-1", "BURST_ENDPOINT_URL": moto_s3.endpoint,
           "BURST_ADDRESSING_STYLE": "path", "BURST_CONFIG": os.devnull}
    run = None
    try:
        wait_for(lambda: query(port, "vector(1)"), prometheus)
        run = subprocess.Popen(
            [sys.executable, "-m", "burst.cli", "run", "--run-id", "staged", "--store",
             moto_s3.url(), "--local", str(tmp_path / "tier"), "--metrics-port",
             str(metrics_port), "--", sys.executable, str(EXAMPLE), "--samples", "64",
             "--epochs", "100000", "--persist-every", "50", "--micro-batch", "4"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "run.log").open("w"))
        series = wait_for(lambda: [s for s in query(port, "burst_ready_bytes_pending == 0")
                                   if query(port, "burst_ready_setup_seconds")], run, 120)
    finally:
        stop_both(run, prometheus)
    assert series[0]["metric"]["run_id"] == "staged"

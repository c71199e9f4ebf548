"""``burst status``: place, snapshot age, pending uploads, last failure and plan, from the
store and the local tier alone."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.resume import status
from burst.resume.status import run_status
from burst.store import open_store
from tests.helpers.plan_helpers import manifest, put_manifest

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10


def test_status_reads_history_snapshots_and_pending_uploads(tmp_path):
    store, local = open_store(str(tmp_path / "remote")), open_store(str(tmp_path / "local"))
    put_manifest(store, manifest("r", step=10, micro=8, global_batch=64))
    put_manifest(local, manifest("r", step=12, micro=8, global_batch=64))
    events.append(store, "r", "failure", kind="gpu-failure", step=11, error="Xid 79")
    events.append(store, "r", "launch", to="local", name="burst-r")
    events.append(local, "r", "node-start", host="n1", node_dir="/nodes/1",
                  plan={"card": "cpu", "micro_batch": 4, "accumulation": 16})
    now = datetime(2025, 1, 1, 0, 10, tzinfo=UTC)
    got = run_status(store, "r", local, now=now)
    assert got["where"]["state"] == "training" and got["where"]["place"].startswith("node n1")
    assert got["snapshot"]["step"] == 12 and got["snapshot"]["in_store"] is False
    assert got["snapshot"]["age_seconds"] == 600
    assert got["pending_uploads"] == [12]
    assert got["last_failure"]["kind"] == "gpu-failure"
    assert got["last_failure"]["reason"] == "Xid 79"
    assert got["plan"] == {"source": "node", "card": "cpu", "micro_batch": 4, "accumulation": 16}


def test_status_cli_table_json_list_and_errors(tmp_path):
    url = str(tmp_path / "store")
    put_manifest(open_store(url), manifest("r1", step=5))
    runner = CliRunner()
    table = runner.invoke(main, ["status", "r1", "--store", url])
    assert table.exit_code == 0 and "step 5" in table.output and "plan in force" in table.output
    listed = runner.invoke(main, ["status", "--store", url, "--json"])
    assert [r["run"] for r in json.loads(listed.output)] == ["r1"]
    missing = runner.invoke(main, ["status", "nope", "--store", url])
    assert missing.exit_code != 0 and "has nothing in" in missing.output
    assert "Traceback" not in missing.output


def test_a_training_process_on_a_node_is_placed_on_that_node():
    history = [{"event": "launch", "to": "local", "time": "t0"},
               {"event": "node-start", "host": "gpu-1", "time": "t1"},
               {"event": "resume", "time": "t2"}]
    assert status.where(history)["place"] == "node gpu-1"
    assert status.where(history)["state"] == "training"


def test_a_training_process_after_its_node_ended_is_placed_here():
    history = [{"event": "node-start", "host": "gpu-1", "time": "t1"},
               {"event": "node-exit", "host": "gpu-1", "returncode": 0, "time": "t2"},
               {"event": "start", "time": "t3"}]
    assert status.where(history)["place"] == "local"

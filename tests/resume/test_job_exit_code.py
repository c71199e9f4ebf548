"""``burst resume`` exits with the job's own meaning (0, 86, 87, 88), read from its nodes'
events in the store, not with the launcher's status (``sky.jobs.tail_logs``: 0 or 100)."""

from __future__ import annotations

import importlib.machinery
import io
import sys
import types

from rich.console import Console

from burst import events
from burst.cli.resume import run_launch
from burst.launch.skypilot import SkyPilotLauncher
from burst.launch.task import NodeSoftware
from burst.plan import planner
from burst.resume import handoff
from burst.resume.status import job_exit_code, now, where
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest
from tests.helpers.store_servers import aws_env


def fake_sky(tail_logs) -> types.ModuleType:
    """SkyPilot's SDK as far as a managed-job launch uses it, without a cloud."""
    sky = types.ModuleType("sky")
    sky.__spec__ = importlib.machinery.ModuleSpec("sky", None)
    sky.Task = types.SimpleNamespace(from_yaml_config=lambda *_a, **_k: "task",
                                     from_yaml_str=lambda *_a, **_k: "task")
    sky.jobs = types.SimpleNamespace(launch=lambda *_a, **_k: "req", tail_logs=tail_logs)
    sky.stream_and_get = lambda *_a, **_k: ([42], None)
    return sky


def event(name: str, time: str, **fields) -> dict:
    return {"event": name, "time": time, **fields}


def test_the_last_attempts_most_telling_node_exit_decides():
    history = [event("launch", "t1"),
               event("node-start", "t2", node_rank="0"), event("node-exit", "t3", returncode=87),
               event("node-start", "t4", node_rank="0"), event("node-start", "t5", node_rank="1"),
               event("node-exit", "t6", returncode=86), event("node-exit", "t7", returncode=88)]
    assert job_exit_code(history, "t1") == 86  # one node's OOM stopped the other's training


def test_a_start_refused_over_the_restart_bound_means_the_failure_that_kept_coming():
    history = [event("node-start", "t2"), event("node-exit", "t3", returncode=87),
               event("restart-limit", "t4", code=87, restarts=2, bound=1)]
    assert job_exit_code(history, "t1") == 87


def test_status_says_a_job_stopped_at_the_restart_bound():
    state = where([event("node-start", "t2", host="n1"),
                   event("restart-limit", "t3", host="n2", restarts=6, bound=5)])
    assert state["state"] == "stopped: 6 restarts, over the bound of 5"
    assert state["place"].startswith("node n2")


def test_no_node_of_this_launch_said_anything():
    history = [event("node-start", "t2"), event("node-exit", "t3", returncode=86)]
    assert job_exit_code(history, "t4") is None  # those were an earlier launch's


def test_resume_exits_with_the_jobs_code_where_skypilot_says_100(moto_s3, monkeypatch,
                                                                  tmp_path):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    url = f"{moto_s3.url()}/{tmp_path.name}"
    store = open_store(url)
    put_manifest(store, manifest("run", peaks={8: 3 * GIB}, card="NVIDIA L4", reason="oom"))
    request = handoff.Request("run", url, str(tmp_path / "local"), cards=["A100"],
                              options=planner.Options(spot="never"),
                              command=("python", "train.py"),
                              software=NodeSoftware(sys.executable, "burst-failover"),
                              private_endpoints=True)  # the test's S3 server is on loopback
    prepared = handoff.prepare(request, say=lambda _m: None)

    def job_runs_and_its_node_reports(job_id=None, follow=False):
        # what the node writes to the store while the managed job runs; SkyPilot says 100
        events.append(store, "run", "node-start", source="node", task_id="sky-1")
        events.append(store, "run", "node-exit", source="node", returncode=86, task_id="sky-1")
        return 100

    monkeypatch.delenv("BURST_SKYPILOT_PYTHON", raising=False)  # the SDK below, in-process
    monkeypatch.setitem(sys.modules, "sky", fake_sky(job_runs_and_its_node_reports))
    before = now()
    out = io.StringIO()
    assert run_launch(prepared, SkyPilotLauncher(), Console(file=out, width=200)) == 86
    assert "ended with exit 86" in out.getvalue() and "skypilot said 100" in out.getvalue()
    (end,) = [e for e in events.read(store, "run") if e["event"] == "launch-end"]
    assert end["returncode"] == 100 and end["time"] >= before  # the launcher's own status

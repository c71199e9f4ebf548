"""The ``skypilot`` launcher up to the SDK boundary, with SkyPilot's own objects.

SkyPilot runs in its own environment, across burst's process boundary
(:mod:`burst.launch.skyworker`). There ``sky.jobs.launch``, ``sky.launch``,
``sky.stream_and_get``, the log tails, ``sky.down`` and ``sky.autostop`` are replaced by recorders
(tests/resume/sky_recorder.py: they would need an API server and cloud credentials); what
they receive is the real ``sky.Task`` built from the rendered YAML, with real
``sky.Resources``, and the secret values that crossed the boundary on stdin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from burst.errors import BurstError
from burst.launch import Reporter, skyenv
from burst.launch.skypilot import SkyPilotLauncher
from burst.launch.task import NodeSoftware, TaskSpec, render
from burst.plan.cards import builtin
from burst.plan.planner import Plan, Target
from burst.plan.regions import place

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIACANARY0000000009", "AWS_SECRET_ACCESS_KEY": "canary-xyz-42"}
RECORDER = Path(__file__).with_name("sky_recorder.py")


def candidate(card: str, infra: str | None, spot: bool) -> Plan:
    target = Target(builtin().get(card), 1, 1, place(infra), spot)
    return Plan(target, 16, 8, 2, "bf16", False, True, None, 1, True, (8, 4))


def rendered(managed: bool = True):
    plans = [candidate("A100", "aws/us-east-1", True), candidate("A100", "gcp", True),
             candidate("A100-80GB", "k8s/bj-a100", False), candidate("H100", None, False)]
    if not managed:  # a cluster has no recovery: on-demand only
        plans = [p for p in plans if not p.target.spot]
    spec = TaskSpec("run-1", 7, "gpu-failure", "burst-run-1", plans, ["python", "train.py"],
                    {"BURST_RUN_ID": "run-1", "BURST_STORE": "s3://b/p"}, sorted(SECRETS),
                    NodeSoftware(None, "burst-failover==0.1"), managed)
    return render(spec)


def public_only():
    spec = TaskSpec("run-1", 7, "gpu-failure", "burst-run-1",
                    [candidate("A100", "aws/us-east-1", False)], ["python", "train.py"],
                    {"BURST_RUN_ID": "run-1", "BURST_STORE": "s3://b/p"}, sorted(SECRETS),
                    NodeSoftware(None, "burst-failover==0.1"), False)
    return render(spec)


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def calls(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def names(self) -> list[str]:
        return [call["name"] for call in self.calls]

    def first(self, name: str) -> tuple[list, dict]:
        call = next(c for c in self.calls if c["name"] == name)
        return call["args"], call["kwargs"]


@pytest.fixture
def recorder(monkeypatch, tmp_path) -> Recorder:
    """SkyPilot's interpreter, wrapped so the worker runs under the recorders."""
    sky = skyenv.find()
    assert sky is not None and sky.python, "SkyPilot's own environment (scripts/setup.sh)"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sky.python} {RECORDER} \"$@\"\n")
    wrapper.chmod(0o755)
    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("BURST_TEST_SKY_RECORD", str(record))
    task = rendered(), rendered(managed=False), public_only()  # checked by the real SkyPilot
    monkeypatch.setenv(skyenv.ENV_PYTHON, str(wrapper))
    rec = Recorder(record)
    rec.tasks = task
    return rec


def test_managed_job_gets_the_real_task_with_ordered_resources_and_secrets(recorder):
    task = recorder.tasks[0]
    events: list[tuple[str, dict]] = []
    report = Reporter(say=lambda _m: None, event=lambda n, **f: events.append((n, f)))
    result = SkyPilotLauncher().launch(task, SECRETS, report)
    assert result.returncode == 0 and "42" in result.where
    assert recorder.names() == ["jobs.launch", "stream_and_get", "jobs.tail_logs"]
    (sky_task,), kwargs = recorder.first("jobs.launch")
    assert sky_task["type"] == "sky.Task" and kwargs == {"name": "burst-run-1"}
    resources = sky_task["resources"]
    assert sky_task["resources_type"] == "list"
    assert all(r["type"] == "Resources" for r in resources)
    assert [(r["accelerators"], r["use_spot"], r["cloud"]) for r in resources] == [
        ({"A100": 1}, True, "AWS"), ({"A100": 1}, True, "GCP"),
        ({"A100-80GB": 1}, False, "Kubernetes"), ({"H100": 1}, False, None)]
    assert resources[0]["region"] == "us-east-1" and resources[2]["region"] == "bj-a100"
    for r in resources:
        assert r["job_recovery"] == {"strategy": "EAGER_NEXT_REGION",
                                     "max_restarts_on_errors": 0, "recover_on_exit_codes": [87, 88]}
    assert sky_task["envs"]["BURST_MAX_RESTARTS"] == "5"  # burst bounds the restarts itself
    assert sky_task["secrets"] == SECRETS
    assert not sky_task["managed_secret_refs"]  # values given inline, nothing to look up
    assert sky_task["envs"]["BURST_RUN_ID"] == "run-1"
    assert "bootstrap.py" in sky_task["setup"] and "node run" in sky_task["run"]
    assert recorder.first("jobs.tail_logs")[1] == {"job_id": 42, "follow": True}
    assert all(value not in os.environ.get("BURST_TEST_SKY_RECORD", "") for value in SECRETS)
    assert events == [("skypilot-job", {"name": "burst-run-1", "job_id": 42})]
    for value in SECRETS.values():
        assert value not in task.yaml


def test_cluster_mode_launches_with_autostop_follows_and_tears_down(recorder):
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7)
    result = launcher.launch(recorder.tasks[1], SECRETS, Reporter(say=lambda _m: None))
    assert result.returncode == 0
    assert recorder.names() == ["launch", "stream_and_get", "tail_logs", "down",
                                "stream_and_get"]
    (sky_task,), kwargs = recorder.first("launch")
    assert sky_task["type"] == "sky.Task"
    assert kwargs == {"cluster_name": "mine", "idle_minutes_to_autostop": 7, "down": True}
    assert all(r["job_recovery"] is None for r in sky_task["resources"])
    assert recorder.first("tail_logs")[0] == ["mine", 3]
    assert recorder.first("down")[0] == ["mine"]


def test_keep_leaves_the_cluster_up_without_autodown(recorder):
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    result = launcher.launch(recorder.tasks[2], SECRETS, Reporter(say=lambda _m: None))
    assert result.returncode == 0 and result.details["kept"] is True
    assert recorder.names() == ["launch", "stream_and_get", "tail_logs"]  # no sky.down
    assert recorder.first("launch")[1] == {"cluster_name": "mine",
                                           "idle_minutes_to_autostop": 7, "down": False}
    described = "\n".join(launcher.describe(recorder.tasks[2], []))
    assert "--down" not in described and "sky down mine  #" not in described


def kept_on_own_capacity(recorder, monkeypatch, landed: str):
    """``--keep`` with a task that holds a Kubernetes context; the cluster comes up at
    ``landed``. The launch's result and what it said."""
    monkeypatch.setenv("BURST_TEST_SKY_LANDED", landed)
    said: list[str] = []
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    return launcher.launch(recorder.tasks[1], SECRETS, Reporter(say=said.append)), said


def test_keep_with_own_capacity_asks_for_no_autostop_so_no_candidate_is_dropped(recorder,
                                                                                monkeypatch):
    result, said = kept_on_own_capacity(recorder, monkeypatch, "k8s/bj-a100")
    assert result.returncode == 0 and result.details["autostop"] is None
    (sky_task,), kwargs = recorder.first("launch")
    assert kwargs == {"cluster_name": "mine", "idle_minutes_to_autostop": None, "down": False}
    assert "Kubernetes" in {r["cloud"] for r in sky_task["resources"]}  # still a candidate
    assert "autostop" not in recorder.names()
    assert any("cannot stop: no autostop, it stays up until sky down mine" in m for m in said)


def test_keep_landing_on_a_public_cloud_gets_its_autostop_after_the_launch(recorder,
                                                                          monkeypatch):
    result, said = kept_on_own_capacity(recorder, monkeypatch, "aws/us-east-1")
    assert recorder.names() == ["launch", "stream_and_get", "autostop", "stream_and_get",
                                "tail_logs"]
    assert recorder.first("autostop") == (["mine", 7], {"down": False})
    assert result.details["autostop"] == 7
    assert any("landed on AWS: it stops after 7 idle minutes" in m for m in said)


def test_keep_with_own_capacity_describes_the_autostop_as_conditional(recorder):
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    described = launcher.describe(recorder.tasks[1], [])
    assert " -i 7" not in described[0]
    assert any(line.startswith("sky autostop mine -i 7") for line in described)


def test_sdk_errors_become_one_line(recorder, monkeypatch):
    monkeypatch.setenv("BURST_TEST_SKY_FAIL", "1")
    with pytest.raises(BurstError, match=r"^SkyPilot: ResourcesUnavailableError: no capacity"):
        SkyPilotLauncher().launch(recorder.tasks[0], SECRETS, Reporter(say=lambda _m: None))

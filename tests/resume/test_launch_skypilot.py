"""The ``skypilot`` launcher up to the SDK boundary, with SkyPilot's own objects.

``sky.jobs.launch``, ``sky.launch``, ``sky.stream_and_get``, the log tails and ``sky.down``
are replaced by recorders (they would need an API server and cloud credentials); what they
receive is the real ``sky.Task`` built from the rendered YAML, with real ``sky.Resources``.
"""

from __future__ import annotations

import pytest
import sky

from burst.launch import Reporter
from burst.launch.skypilot import SkyPilotLauncher
from burst.launch.task import NodeSoftware, TaskSpec, render
from burst.plan.cards import builtin
from burst.plan.planner import Plan, Target
from burst.plan.regions import place

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIACANARY0000000009", "AWS_SECRET_ACCESS_KEY": "canary-xyz-42"}


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


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def fn(self, name: str, result: object):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return result
        return call

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    def first(self, name: str) -> tuple[tuple, dict]:
        return next((a, k) for n, a, k in self.calls if n == name)


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(sky.jobs, "launch", rec.fn("jobs.launch", "req-jobs"))
    monkeypatch.setattr(sky.jobs, "tail_logs", rec.fn("jobs.tail_logs", 0))
    monkeypatch.setattr(sky, "launch", rec.fn("launch", "req-launch"))
    monkeypatch.setattr(sky, "tail_logs", rec.fn("tail_logs", 0))
    monkeypatch.setattr(sky, "down", rec.fn("down", "req-down"))
    results = {"req-jobs": ([42], None), "req-launch": (3, None), "req-down": None}
    monkeypatch.setattr(sky, "stream_and_get",
                        lambda request_id=None, **_: rec.calls.append(
                            ("stream_and_get", (request_id,), {})) or results[request_id])
    return rec


def test_managed_job_gets_the_real_task_with_ordered_resources_and_secrets(recorder):
    task = rendered()
    events: list[tuple[str, dict]] = []
    report = Reporter(say=lambda _m: None, event=lambda n, **f: events.append((n, f)))
    result = SkyPilotLauncher().launch(task, SECRETS, report)
    assert result.returncode == 0 and "42" in result.where
    assert recorder.names() == ["jobs.launch", "stream_and_get", "jobs.tail_logs"]
    (sky_task,), kwargs = recorder.first("jobs.launch")
    assert isinstance(sky_task, sky.Task) and kwargs == {"name": "burst-run-1"}
    resources = sky_task.resources
    assert isinstance(resources, list) and all(isinstance(r, sky.Resources) for r in resources)
    assert [(r.accelerators, r.use_spot, r.cloud and str(r.cloud)) for r in resources] == [
        ({"A100": 1}, True, "AWS"), ({"A100": 1}, True, "GCP"),
        ({"A100-80GB": 1}, False, "Kubernetes"), ({"H100": 1}, False, None)]
    assert resources[0].region == "us-east-1" and resources[2].region == "bj-a100"
    for r in resources:
        assert r.job_recovery == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0,
                                  "recover_on_exit_codes": [87, 88]}
    assert sky_task.envs["BURST_MAX_RESTARTS"] == "5"  # burst bounds the restarts itself
    assert {k: v.get_secret_value() for k, v in sky_task.secrets.items()} == SECRETS
    assert not sky_task.managed_secret_refs  # values given inline, nothing to look up
    assert sky_task.envs["BURST_RUN_ID"] == "run-1"
    assert "bootstrap.py" in sky_task.setup and "node run" in sky_task.run
    assert recorder.first("jobs.tail_logs")[1] == {"job_id": 42, "follow": True}
    assert events == [("skypilot-job", {"name": "burst-run-1", "job_id": 42})]
    for value in SECRETS.values():
        assert value not in task.yaml


def test_cluster_mode_launches_with_autostop_follows_and_tears_down(recorder):
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7)
    result = launcher.launch(rendered(managed=False), SECRETS, Reporter(say=lambda _m: None))
    assert result.returncode == 0
    assert recorder.names() == ["launch", "stream_and_get", "tail_logs", "down",
                                "stream_and_get"]
    (sky_task,), kwargs = recorder.first("launch")
    assert isinstance(sky_task, sky.Task)
    assert kwargs == {"cluster_name": "mine", "idle_minutes_to_autostop": 7, "down": True}
    assert all(r.job_recovery is None for r in sky_task.resources)
    assert recorder.first("tail_logs")[0] == ("mine", 3)
    assert recorder.first("down")[0] == ("mine",)


def public_only():
    spec = TaskSpec("run-1", 7, "gpu-failure", "burst-run-1",
                    [candidate("A100", "aws/us-east-1", False)], ["python", "train.py"],
                    {"BURST_RUN_ID": "run-1", "BURST_STORE": "s3://b/p"}, sorted(SECRETS),
                    NodeSoftware(None, "burst-failover==0.1"), False)
    return render(spec)


def test_keep_leaves_the_cluster_up_without_autodown(recorder):
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    result = launcher.launch(public_only(), SECRETS, Reporter(say=lambda _m: None))
    assert result.returncode == 0 and result.details["kept"] is True
    assert recorder.names() == ["launch", "stream_and_get", "tail_logs"]  # no sky.down
    assert recorder.first("launch")[1] == {"cluster_name": "mine",
                                           "idle_minutes_to_autostop": 7, "down": False}
    described = "\n".join(launcher.describe(public_only(), []))
    assert "--down" not in described and "sky down mine  #" not in described


def landed(recorder, monkeypatch, infra: str) -> None:
    """``sky.launch``'s handle says the cluster came up at ``infra``."""
    from types import SimpleNamespace

    handle = SimpleNamespace(launched_resources=sky.Resources(infra=infra))
    monkeypatch.setattr(sky, "autostop", recorder.fn("autostop", "req-autostop"))
    results = {"req-launch": (3, handle), "req-autostop": None}
    monkeypatch.setattr(sky, "stream_and_get", lambda request_id=None, **_: recorder.calls.append(
        ("stream_and_get", (request_id,), {})) or results[request_id])


def test_keep_with_own_capacity_asks_for_no_autostop_so_no_candidate_is_dropped(recorder,
                                                                                monkeypatch):
    landed(recorder, monkeypatch, "k8s/bj-a100")
    said: list[str] = []
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    result = launcher.launch(rendered(managed=False), SECRETS, Reporter(say=said.append))
    assert result.returncode == 0
    (sky_task,), kwargs = recorder.first("launch")
    assert kwargs == {"cluster_name": "mine", "idle_minutes_to_autostop": None, "down": False}
    assert "Kubernetes" in {str(r.cloud) for r in sky_task.resources}  # still a candidate
    assert "autostop" not in recorder.names()
    assert any("cannot stop: no autostop, it stays up until sky down mine" in m for m in said)


def test_keep_landing_on_a_public_cloud_gets_its_autostop_after_the_launch(recorder,
                                                                          monkeypatch):
    landed(recorder, monkeypatch, "aws/us-east-1")
    launcher = SkyPilotLauncher(mode="cluster", cluster="mine", idle_minutes=7, keep=True)
    launcher.launch(rendered(managed=False), SECRETS, Reporter(say=lambda _m: None))
    assert recorder.first("autostop") == (("mine", 7), {"down": False})


def test_sdk_errors_become_one_line(monkeypatch):
    def boom(*_a, **_k):
        raise sky.exceptions.ResourcesUnavailableError("no capacity anywhere\ndetails...")
    monkeypatch.setattr(sky.jobs, "launch", boom)
    from burst.errors import BurstError

    with pytest.raises(BurstError, match=r"^SkyPilot: ResourcesUnavailableError: no capacity"):
        SkyPilotLauncher().launch(rendered(), SECRETS, Reporter(say=lambda _m: None))

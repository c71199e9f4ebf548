"""The preemption watcher against a fake metadata server on loopback (AWS IMDSv2, GCP's
metadata server, Azure scheduled events), and a real training process that sees the notice,
uploads a snapshot to a real S3 server before SIGTERM, and loses nothing past its last step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.contract import ENV_FAILURE_DIR, ENV_METADATA_URL, Exit, Reason
from burst.snapshot import reader
from burst.store import open_store
from burst.training import preemption
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, aws_env, free_port, wait_until

AWS_TOKEN = "fake-imds-token"


class FakeMetadata:
    """One cloud's metadata server, enough of it to preempt a node: the notice appears when
    the test calls :meth:`preempt`; GCP long polls wake at once, as the real server's do."""

    def __init__(self, provider: str, spot: bool = True) -> None:
        self.provider, self.spot = provider, spot
        self.preempted = False
        self.azure_events: list[dict] = []
        self.etag = 1
        self.closed = False
        self.served: dict[str, int] = {}
        self.cond = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(*fake.answer("GET", self.path, self.headers))

            def do_PUT(self) -> None:
                self._answer(*fake.answer("PUT", self.path, self.headers))

            def _answer(self, status: int, body: str, headers: dict) -> None:
                data = body.encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeMetadata:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def preempt(self) -> None:
        with self.cond:
            self.preempted = True
            self.etag += 1
            self.azure_events.append({"EventId": "E-2", "EventType": "Preempt",
                                      "ResourceType": "VirtualMachine", "Resources": ["vm0"],
                                      "EventStatus": "Scheduled",
                                      "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"})
            self.cond.notify_all()

    def answer(self, method: str, raw_path: str, headers) -> tuple[int, str, dict]:
        parts = urlsplit(raw_path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self.cond:
            self.served[parts.path] = self.served.get(parts.path, 0) + 1
        return getattr(self, f"_{self.provider}")(method, parts.path, query, headers)

    def _aws(self, method: str, path: str, _query: dict, headers) -> tuple[int, str, dict]:
        if method == "PUT":
            if path == "/latest/api/token" and headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 200, AWS_TOKEN, {}
            return 400, "", {}
        if headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
            return 401, "", {}
        if path == "/latest/meta-data/instance-life-cycle":
            return 200, "spot" if self.spot else "on-demand", {}
        if path == "/latest/meta-data/spot/instance-action" and self.preempted:
            return 200, json.dumps({"action": "terminate", "time": "2026-12-01T14:00:00Z"}), {}
        return 404, "", {}

    def _gcp(self, _method: str, path: str, query: dict, headers) -> tuple[int, str, dict]:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "", {}
        google = {"Metadata-Flavor": "Google"}
        if path == "/computeMetadata/v1/instance/scheduling/preemptible":
            return 200, "TRUE" if self.spot else "FALSE", google
        if path != "/computeMetadata/v1/instance/preempted":
            return 404, "", google
        with self.cond:
            if query.get("wait_for_change") == "true":
                deadline = time.monotonic() + float(query.get("timeout_sec", 60))
                while (query.get("last_etag") == str(self.etag) and not self.closed
                       and time.monotonic() < deadline):
                    self.cond.wait(deadline - time.monotonic())
            return 200, "TRUE" if self.preempted else "FALSE", {**google, "ETag": str(self.etag)}

    def _azure(self, _method: str, path: str, query: dict, headers) -> tuple[int, str, dict]:
        if headers.get("Metadata") != "true" or "api-version" not in query:
            return 400, "", {}
        if path == "/metadata/instance/compute/vmId":
            return 200, "02aab8a4-74ef-476e-8182-f6d2ba4166a6", {}
        if path == "/metadata/instance/compute/priority":
            return 200, "Spot" if self.spot else "Regular", {}
        if path == "/metadata/scheduledevents":
            with self.cond:
                return 200, json.dumps({"DocumentIncarnation": len(self.azure_events),
                                        "Events": list(self.azure_events)}), {}
        return 404, "", {}

    def _alibaba(self, method: str, path: str, _query: dict, headers) -> tuple[int, str, dict]:
        # the hardened mode: every read needs the token a PUT hands out
        if method == "PUT":
            if path == "/latest/api/token" and headers.get(
                    "X-aliyun-ecs-metadata-token-ttl-seconds"):
                return 200, ALIBABA_TOKEN, {}
            return 400, "", {}
        if headers.get("X-aliyun-ecs-metadata-token") != ALIBABA_TOKEN:
            return 403, "", {}
        if path == "/latest/meta-data/instance-id":
            return 200, "i-2zeabcdefghijklmnopq", {}
        if path == "/latest/meta-data/instance/spot/termination-time" and self.preempted:
            return 200, "2026-12-02T14:05:00Z", {}
        return 404, "", {}


ALIBABA_TOKEN = "fake-ecs-token"


class Noticed:
    """Takes the watcher's two calls the way a run does: the snapshot request, the event."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.events: list[tuple[str, dict]] = []
        self.done = threading.Event()

    def request_snapshot(self, reason: str) -> None:
        self.requests.append(reason)

    def record_event(self, name: str, /, **fields: object) -> None:
        self.events.append((name, fields))
        self.done.set()


def watch(fake: FakeMetadata, target: Noticed, **options: object) -> preemption.Watcher:
    return preemption.Watcher(fake.provider, target, base_url=fake.url, poll=0.02,
                              **options).start()  # type: ignore[arg-type]


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused


# -- the providers ------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure", "alibaba"])
def test_a_notice_asks_for_a_preemption_snapshot_and_records_the_event(provider):
    target = Noticed()
    with FakeMetadata(provider) as fake:
        watcher = watch(fake, target)
        wait_until(lambda: watcher.provider is not None, "first contact", None, timeout=10)
        assert target.requests == [] and watcher.notice is None  # no notice, nothing asked
        fake.preempt()
        assert target.done.wait(10)
        assert watcher.join(10)
    assert target.requests == [Reason.PREEMPTION]
    [(name, fields)] = target.events
    assert (name, fields["provider"]) == (preemption.EVENT, provider)
    assert fields["spot"] is (None if provider == "alibaba" else True)  # ECS does not say
    assert fields["seen"]


def test_alibabas_interruption_notice_names_the_release_time_five_minutes_ahead():
    target = Noticed()
    with FakeMetadata("alibaba") as fake:
        watcher = watch(fake, target, spot=True)  # an ACK spot node pool says so
        wait_until(lambda: watcher.provider is not None, "first contact", None, timeout=10)
        fake.preempt()
        assert target.done.wait(10)
    [(_, fields)] = target.events
    assert (fields["action"], fields["deadline"]) == ("release", "2026-12-02T14:05:00Z")
    assert watcher.bound == 300.0 and watcher.persist_seconds(600.0, cost=30.0) == 270.0


def test_probe_on_an_ack_node_asks_alibabas_address_after_the_others_go_unanswered():
    target = Noticed()
    with FakeMetadata("alibaba") as fake:
        watcher = preemption.Watcher("probe", target, poll=0.02)  # each cloud's own address
        original = {name: cls.base for name, cls in preemption.PROVIDERS.items()}
        try:  # 169.254.169.254 is nobody here (dead port); Alibaba's is the fake
            for name, cls in preemption.PROVIDERS.items():
                cls.base = fake.url if name == "alibaba" else dead_url()
            watcher.start()
            wait_until(lambda: watcher.provider is not None, "first contact", None,
                       timeout=20)
            watcher.stop()
        finally:
            for name, cls in preemption.PROVIDERS.items():
                cls.base = original[name]
    assert watcher.provider is not None and watcher.provider.name == "alibaba"


def test_in_a_pod_without_metadata_the_grace_period_bounds_lost_work():
    watcher = preemption.start(Noticed(), environ={
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Kubernetes"}),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1", "BURST_METADATA_URL": dead_url(),
        "BURST_TERMINATION_GRACE": "45", "BURST_SPOT": "1"})
    assert watcher is not None and watcher.join(20)
    assert watcher.provider is not None and watcher.provider.name == "kubernetes"
    assert watcher.bound == 45.0 and watcher.persist_seconds(600.0, cost=5.0) == 40.0
    default = preemption.start(Noticed(), environ={"BURST_PREEMPTION": "kubernetes",
                                                   "BURST_SPOT": "1"})
    assert default is not None and default.join(5) and default.bound == 30.0


def test_azure_events_other_than_preempt_are_not_a_notice():
    target = Noticed()
    with FakeMetadata("azure") as fake:
        fake.azure_events.append({"EventId": "E-1", "EventType": "Freeze",
                                  "EventStatus": "Scheduled", "NotBefore": ""})
        watcher = watch(fake, target)
        wait_until(lambda: watcher.provider is not None, "first contact", None, timeout=10)
        wait_until(lambda: fake.served.get("/metadata/scheduledevents", 0) >= 3,
                   "polls that see the Freeze event", None, timeout=10)
        assert target.requests == [] and watcher.notice is None
        fake.preempt()
        assert target.done.wait(10)
    assert target.events[0][1]["event_id"] == "E-2"


def test_probe_finds_the_cloud_whose_metadata_server_answers():
    target = Noticed()
    with FakeMetadata("azure") as fake:
        watcher = preemption.Watcher("probe", target, base_url=fake.url, poll=0.02).start()
        wait_until(lambda: watcher.provider is not None, "first contact", None, timeout=10)
    assert watcher.provider is not None and watcher.provider.name == "azure"


# -- the spot bound -----------------------------------------------------------------------


def test_on_a_spot_node_the_persist_interval_keeps_lost_work_under_the_notice_period():
    with FakeMetadata("aws", spot=True) as fake:
        watcher = watch(fake, Noticed())
        wait_until(lambda: watcher.spot is not None, "spot detection", None, timeout=10)
        watcher.stop()
    assert watcher.spot is True and watcher.bound == 120.0  # AWS: two minutes
    assert watcher.persist_seconds(300.0, cost=20.0) == 100.0
    assert watcher.persist_seconds(None, cost=20.0) == 100.0
    assert watcher.persist_seconds(60.0, cost=20.0) == 60.0  # the user's is already shorter
    assert watcher.persist_seconds(300.0, cost=150.0) == 150.0  # as fast as uploads go


def test_a_user_bound_replaces_the_notice_period_and_on_demand_nodes_keep_their_interval():
    with FakeMetadata("gcp", spot=False) as fake:
        on_demand = watch(fake, Noticed(), max_lost_seconds=10.0)
        wait_until(lambda: on_demand.provider is not None, "first contact", None, timeout=10)
        on_demand.stop()
    assert on_demand.spot is False
    assert on_demand.persist_seconds(300.0, cost=2.0) == 300.0
    forced = preemption.Watcher("gcp", Noticed(), max_lost_seconds=10.0, spot=True)
    assert forced.persist_seconds(300.0, cost=2.0) == 8.0


# -- which node watches -------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, None),  # a laptop: no thread, no packet
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS"})}, "aws"),
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "GCP"})}, "gcp"),
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Azure"})}, "azure"),
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Kubernetes"})}, "probe"),
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "local"})}, None),  # burst's stub
    ({"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS"}), "BURST_PREEMPTION": "off"}, None),
    ({"BURST_PREEMPTION": "gcp"}, "gcp"),
    ({"BURST_METADATA_URL": "http://127.0.0.1:1"}, "probe"),
])
def test_the_environment_decides_whether_and_what_to_watch(environ, expected):
    assert preemption.detect(environ) == expected


def test_without_a_metadata_server_the_watcher_gives_up_quietly(capfd):
    target = Noticed()
    watcher = preemption.Watcher("aws", target, base_url=dead_url(), poll=0.02).start()
    assert watcher.join(10)
    assert watcher.gave_up and watcher.provider is None and target.requests == []
    assert capfd.readouterr().err == ""


def test_training_without_a_metadata_server_takes_only_its_own_snapshots(tmp_path, monkeypatch):
    monkeypatch.setenv(preemption.ENV_PROVIDER, "gcp")
    monkeypatch.setenv(ENV_METADATA_URL, dead_url())
    monkeypatch.setenv("BURST_FREEZE", "0")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run("no-metadata", store=tmp_path / "store", global_batch=8, micro_batch=4,
                    persist_seconds=None)
    run.attach(model, optimizer)
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
    for _ in run.epochs(2):
        for step in run.steps(loader):
            for x, y in step:
                (torch.nn.functional.mse_loss(model(x), y) * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
    run.close()
    store = open_store(tmp_path / "store")
    assert run.step == 8 and reader.list_steps(store, "no-metadata") == [8]
    names = [json.loads(line)["event"] for line in
             store.get(events.key("no-metadata")).decode().splitlines()]
    assert names == ["start", "snapshot", "finish"]


# -- a real training process on a spot node ------------------------------------------------

TRAIN = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import burst

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
run = burst.Run("spot", store=sys.argv[1], global_batch=8, micro_batch=4, shadow_every=1000,
                persist_seconds=None, grace_seconds=20)
run.attach(model, optimizer)
loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
for epoch in run.epochs(10_000):
    for step in run.steps(loader):
        for x, y in step:
            (torch.nn.functional.mse_loss(model(x), y) * step.weight(len(x))).backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step.index}", flush=True)
        time.sleep(0.02)
"""


class Progress:
    """The training process's ``step N`` lines, read as they come from its stdout alone:
    burst's own messages go to stderr, and another thread's message can land in the pipe
    between a print's text and its newline, so the two streams are never merged."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.last = 0
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line)
            if line.startswith("step "):
                self.last = int(line.split()[1])

    def finish(self) -> None:
        self._thread.join(10)


def terminate(process: subprocess.Popen, grace: float) -> int:
    """What a cloud does at the end of the notice: SIGTERM, then SIGKILL after a grace."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10)


@pytest.mark.e2e
def test_a_notice_gets_a_snapshot_uploaded_before_sigterm_and_nothing_is_lost(
        tmp_path: Path, moto_s3, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    url = moto_s3.url()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    store = open_store(url)
    with FakeMetadata("aws") as fake, (tmp_path / "stderr.log").open("w") as messages:
        env = {**os.environ, "BURST_LOCAL": str(tmp_path / "local"), "BURST_FREEZE": "0",
               "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS", "region": "us-east-1"}),
               ENV_METADATA_URL: fake.url, preemption.ENV_POLL: "0.05",
               ENV_FAILURE_DIR: str(tmp_path / "failures")}
        process = subprocess.Popen([sys.executable, str(script), url], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=messages)
        progress = Progress(process)
        try:
            wait_until(lambda: progress.last >= 3, "training", process, timeout=60)
            assert reader.list_steps(store, "spot") == []  # no periodic snapshots here
            noticed_at = progress.last
            fake.preempt()
            wait_until(lambda: reader.list_steps(store, "spot"), "the notice's snapshot",
                       process, timeout=60)
            # in the store before any signal: committed (a manifest) and uploaded
            [first] = reader.list_steps(store, "spot")
            manifest = reader.read_manifest(store, "spot", first)
            assert manifest is not None and manifest["reason"] == Reason.PREEMPTION
            assert first >= noticed_at
            wait_until(lambda: progress.last > first, "training after the notice", process,
                       timeout=30)
        finally:
            code = terminate(process, grace=20)
            progress.finish()
    output = "".join(progress.lines) + (tmp_path / "stderr.log").read_text()
    assert code == Exit.STOPPED, output
    assert reader.list_steps(store, "spot")[-1] == progress.last  # nothing past the last step
    history = events.read(store, "spot")
    [notice] = [e for e in history if e["event"] == preemption.EVENT]
    assert (notice["provider"], notice["action"], notice["spot"]) == ("aws", "terminate", True)

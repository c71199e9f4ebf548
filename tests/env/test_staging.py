"""Pre-staging: the parts a node needs go to a real S3 server in the background, throttled
behind snapshots, resumably; readiness says what is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from burst.env import readiness, stageparts, throttle, wheelhouse
from burst.env.stager import Stager
from burst.errors import ConfigError
from burst.snapshot import traffic
from burst.store import open_store
from tests.conftest import ROOT
from tests.helpers.staging_helpers import house_of, small_lock, synthetic_wheel
from tests.helpers.store_servers import aws_env

TARGET = wheelhouse.Target("3.11", policy="all")


@pytest.fixture
def s3(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    traffic.reset()
    return open_store(moto_s3.url(), **moto_s3.options())


class FakeTime:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def unthrottled(stop: threading.Event | None = None) -> throttle.TokenBucket:
    return throttle.TokenBucket(lambda: 1e12, paused=lambda: False, stop=stop)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("print('training')\n")
    return root


def wheels_context(tmp_path: Path, sizes: dict[str, int], lock_names=("a",)) -> tuple[
        stageparts.Context, wheelhouse.Wheelhouse]:
    paths = [synthetic_wheel(tmp_path / "wheels", name, size) for name, size in sizes.items()]
    house = house_of(paths, TARGET, burst_wheel=paths[0])
    lock = small_lock(*lock_names)
    context = stageparts.Context("run", lambda: lock, tmp_path, target=TARGET,
                                 build=lambda _lock, _target: house)
    return context, house


# -- the throttle ------------------------------------------------------------------------


def test_the_bucket_sends_at_its_rate():
    fake = FakeTime()
    bucket = throttle.TokenBucket(lambda: 1e6, paused=lambda: False, clock=fake.clock,
                                  sleep=fake.sleep)
    bucket.wait(5_000_000)
    assert fake.now == pytest.approx(5.0, rel=0.01)


def test_the_bucket_takes_nothing_while_a_snapshot_uploads():
    fake = FakeTime()
    uploading = [True]

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if fake.now >= 3.0:
            uploading[0] = False  # the snapshot's upload ends after 3 s

    bucket = throttle.TokenBucket(lambda: 1e6, paused=lambda: uploading[0], clock=fake.clock,
                                  sleep=sleep)
    bucket.wait(1_000_000)
    assert bucket.paused_seconds == pytest.approx(3.0, abs=0.06)
    assert fake.now == pytest.approx(4.0, abs=0.06)  # no tokens accrued while paused


def test_a_stop_ends_a_wait_at_once():
    stop = threading.Event()
    bucket = throttle.TokenBucket(lambda: 1.0, paused=lambda: False, stop=stop)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    bucket.wait(10_000_000)  # 115 days at 1 byte/s
    assert time.monotonic() - started < 5


def test_the_rate_setting_is_bytes_per_second_or_a_share_of_the_uplink():
    assert throttle.parse_rate("30Mbit") == (3.75e6, None)
    assert throttle.parse_rate("4MB") == (4e6, None)
    assert throttle.parse_rate("50%") == (None, 0.5)
    traffic.reset()
    traffic.record(8_000_000, 2.0)
    assert throttle.configured({throttle.RATE_ENV: "25%"})() == pytest.approx(1e6)


@pytest.mark.parametrize("bad", ["fast", "0", "150%", "3 furlongs"])
def test_a_bad_rate_setting_is_one_clear_error(bad):
    with pytest.raises(ConfigError, match=throttle.RATE_ENV):
        throttle.parse_rate(bad)


class Watching:
    """The store, noting at each call whether the uplink was marked busy then."""

    def __init__(self, store) -> None:
        self.store, self.busy = store, []

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.busy.append(traffic.busy())
            return attr(*args, **kwargs)

        return call


def test_a_snapshot_upload_marks_the_uplink_busy_and_measures_it(s3, tmp_path):
    import torch

    from burst.snapshot.upload import UploadQueue
    from burst.store.local import LocalStore
    from tests.helpers.snapshot_helpers import take

    local = LocalStore(tmp_path / "tier")
    take(local, 1, {"w": torch.randn(600_000)})  # 2.4 MB: enough to be measured
    remote = Watching(s3)
    queue = UploadQueue(local, remote, "run")
    queue.submit(1)
    queue.flush(60)
    assert remote.busy and all(remote.busy)
    assert not traffic.busy() and traffic.uplink() > 0


# -- readiness with real objects -----------------------------------------------------------


def test_readiness_falls_to_zero_once_staged_and_rises_when_the_code_changes(s3, tmp_path):
    root = project(tmp_path)
    context = stageparts.Context("run", small_lock, root)
    stager = Stager(s3, "run", stageparts.code_parts(context), bucket=unthrottled())
    before = stager.readiness()
    assert before.pending_objects == 1 and before.pending_bytes > 0
    assert stager.run_once().ready
    (root / "train.py").write_text("print('training, changed')\n")
    restarted = Stager(s3, "run", stageparts.code_parts(stageparts.Context("run", small_lock,
                                                                           root)))
    assert restarted.readiness().pending_objects == 1  # the new archive is not there yet


def test_wheels_are_staged_before_their_index_and_then_count_as_ready(s3, tmp_path):
    context, house = wheels_context(tmp_path, {"burst-failover": 50_000, "dep": 300_000})
    parts = stageparts.wheel_parts(context)
    stager = Stager(s3, "run", parts, bucket=unthrottled())
    assert [p.name for p in parts] == ["burst-wheel", "wheelhouse"]
    assert not stager.readiness().ready  # not even built yet
    assert stager.run_once().ready
    index = wheelhouse.load_index(s3, "run", context.lock().digest)
    assert sorted(w["file"] for w in index["wheels"]) == sorted(w.file for w in house.wheels)
    assert wheelhouse.ensure(s3, "run", context.lock(), TARGET) is None  # resume: nothing


def test_the_stager_publishes_readiness_to_the_local_state_and_history(s3, tmp_path):
    from burst import events
    from burst.store.local import LocalStore

    local = LocalStore(tmp_path / "tier")
    context = stageparts.Context("run", small_lock, project(tmp_path))
    stager = Stager(s3, "run", stageparts.code_parts(context), state=local,
                    bucket=unthrottled())
    stager.publish()
    stager.run_once()
    assert readiness.load(local, "run").ready
    recorded = [e for e in events.read(s3, "run") if e["event"] == "readiness"]
    assert [e["ready"] for e in recorded] == [False, True]


def test_the_stager_pauses_while_a_snapshot_uploads(s3, tmp_path):
    context, _ = wheels_context(tmp_path, {"burst-failover": 10_000, "dep": 10_000})
    stager = Stager(s3, "run", stageparts.wheel_parts(context), poll=0.1,
                    bucket=throttle.TokenBucket(lambda: 1e12))  # paused by real traffic
    with traffic.sending():
        stager.start()
        time.sleep(1.0)
        assert s3.list("wheels/") == []  # nothing went while the snapshot had the link
    deadline = time.monotonic() + 20
    while len(s3.list("wheels/")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stager.stop()
    assert stager.join(10)
    assert len(s3.list("wheels/")) == 2


def test_a_local_store_counts_as_ready_with_staging_off(tmp_path):
    from burst.env.stager import LOCAL_ONLY, start_for_run
    from burst.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    assert start_for_run(store, "run", local=None, lock=small_lock, code_dir=tmp_path,
                         exclude=[]) is None
    published = _published(store, "run")  # written beside training, not in its thread
    assert published.ready and published.staging == LOCAL_ONLY


def _published(store, run_id: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while (found := readiness.load(store, run_id)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


# -- killed mid-way ------------------------------------------------------------------------

def stage_in_child(s3_url: str, endpoint: str, wheels: list[Path], rate: str,
                   out: Path) -> subprocess.Popen:
    args = {"url": s3_url, "endpoint": endpoint, "wheels": [str(w) for w in wheels],
            "rate": rate, "out": str(out)}
    return subprocess.Popen([sys.executable, "-m", "tests.env.stage_child", json.dumps(args)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_pre_staging_killed_mid_way_resumes_without_resending_what_landed(s3, moto_s3,
                                                                         tmp_path):
    paths = [synthetic_wheel(tmp_path / "wheels", f"dep{i}", 200_000) for i in range(12)]
    child = stage_in_child(s3.url, moto_s3.endpoint, paths, "400kB", tmp_path / "first.json")
    deadline = time.monotonic() + 30
    while len(s3.list("wheels/")) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    landed = set(s3.list("wheels/"))
    assert 3 <= len(landed) < 12, "the kill came too late to test anything"
    again = stage_in_child(s3.url, moto_s3.endpoint, paths, "100MB", tmp_path / "second.json")
    assert again.wait(60) == 0
    sent = json.loads((tmp_path / "second.json").read_text())
    assert not landed & set(sent["puts"])  # nothing complete is sent again
    assert len(landed) + len([k for k in sent["puts"] if k.startswith("wheels/")]) == 12
    assert sent["ready"]


def test_after_pre_staging_a_burst_uploads_only_the_newest_snapshots_new_blobs(s3, tmp_path):
    import torch

    from burst.snapshot import sync
    from burst.store.local import LocalStore
    from tests.env.stage_child import Recording
    from tests.helpers.snapshot_helpers import take

    context, _ = wheels_context(tmp_path, {"burst-failover": 20_000, "dep": 80_000})
    root = project(tmp_path)
    code = stageparts.code_parts(stageparts.Context("run", context.lock, root))
    assert Stager(s3, "run", code + stageparts.wheel_parts(context),
                  bucket=unthrottled()).run_once().ready
    local = LocalStore(tmp_path / "tier")
    frozen = torch.arange(50_000, dtype=torch.float32)
    take(local, 1, {"frozen": frozen, "head": torch.zeros(10)})
    sync.push(local, s3, "run")
    take(local, 2, {"frozen": frozen, "head": torch.ones(10)})  # the failure: step 2 is new
    recording = Recording(s3)
    assert wheelhouse.ensure(recording, "run", context.lock(), TARGET) is None
    assert all(p.pending(recording).ready for p in code)
    sync.push(local, recording, "run")
    blobs = [k for k in recording.puts if "/blobs/" in k]
    assert len(blobs) == 1  # the changed head; the frozen backbone was there already
    assert not [k for k in recording.puts if k.startswith("wheels/") or "/code/" in k]


def test_the_stager_follows_the_wheelhouse_choice_recorded_at_push(s3, tmp_path):
    from burst.env import wheelchoice

    wheelchoice.record(s3, "run", wheelchoice.Choice(policy="none"))
    context, _ = wheels_context(tmp_path, {"burst-failover": 10_000, "dep": 10_000})
    context.target = None  # what the freeze would build: the recorded choice says none
    stager = Stager(s3, "run", stageparts.wheel_parts(context), bucket=unthrottled())
    assert stager.readiness().ready
    stager.run_once()
    assert s3.list("wheels/") == []


def test_a_run_with_a_remote_store_pre_stages_and_its_close_stops_the_stager(s3, tmp_path,
                                                                           monkeypatch):
    import torch

    import burst

    monkeypatch.chdir(project(tmp_path))
    tier = tmp_path / "tier"
    run = burst.Run("staged", store=s3, local=str(tier), global_batch=4)
    model = torch.nn.Linear(2, 2)
    run.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    deadline = time.monotonic() + 60
    published = None
    while time.monotonic() < deadline and not (published and published.ready):
        time.sleep(0.1)
        published = readiness.load(open_store(str(tier)), "staged")
    assert published is not None and published.ready
    assert any(t.name == "burst-stage" for t in threading.enumerate())
    run.close()
    deadline = time.monotonic() + 10
    while any(t.name == "burst-stage" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the stager outlived the run's close"
        time.sleep(0.05)


def test_the_wheels_the_stager_reads_are_never_taken_for_the_runs_inputs(tmp_path,
                                                                      monkeypatch):
    from burst.inputs import selection

    monkeypatch.setenv(wheelhouse.CACHE_ENV, str(tmp_path / "wheel-cache"))
    wheel = str(tmp_path / "wheel-cache" / "built" / "torch-2.5.1-cp311-linux_x86_64.whl")
    assert any(selection.under(wheel, d) for d in selection.environment_dirs())

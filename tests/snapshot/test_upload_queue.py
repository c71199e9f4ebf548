"""The background upload queue: never blocks, newest wins, retries, flushes with a deadline."""

from __future__ import annotations

import random
import threading
import time

import pytest

from burst.errors import StoreError
from burst.snapshot import reader
from burst.snapshot.upload import UploadQueue
from burst.store import LocalStore, MemoryStore, TransientStoreError
from burst.store.retry import RetryPolicy, retry
from tests.helpers.snapshot_helpers import take

FAST = RetryPolicy(attempts=4, base=0.001, cap=0.001)


class Gate(MemoryStore):
    """A remote whose blob writes wait until the test opens the gate."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def put(self, key, data):
        if "/blobs/" in key:
            self.entered.set()
            assert self.gate.wait(10)
        super().put(key, data)


class Flaky(MemoryStore):
    """A remote that throttles its first ``n`` writes (like S3's 503 SlowDown)."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name)
        self.failures_left = n

    def put(self, key, data):
        if self.failures_left > 0:
            self.failures_left -= 1
            raise TransientStoreError("SlowDown (HTTP 503)")
        super().put(key, data)


class Denied(MemoryStore):
    def put(self, key, data):
        raise StoreError("access denied")


@pytest.fixture
def local(tmp_path):
    return LocalStore(tmp_path / "local")


def test_submit_returns_at_once_while_an_upload_is_stuck(local):
    take(local, 1)
    remote = Gate("gate-1")
    queue = UploadQueue(local, remote, "run", policy=FAST)
    queue.submit(1)
    assert remote.entered.wait(5)
    started = time.perf_counter()
    queue.submit(1)
    assert time.perf_counter() - started < 0.05
    remote.gate.set()
    queue.flush(10)


def test_when_uploads_fall_behind_the_newest_snapshot_wins(local):
    for step in (1, 2, 3, 4):
        take(local, step)
    remote = Gate("gate-2")
    queue = UploadQueue(local, remote, "run", policy=FAST)
    queue.submit(1)
    assert remote.entered.wait(5)
    for step in (2, 3, 4):
        queue.submit(step)
    remote.gate.set()
    queue.flush(10)
    assert [t.step for t in queue.uploaded] == [1, 4]
    assert queue.skipped == [2, 3]
    assert reader.list_steps(remote, "run") == [1, 4]


def test_flush_with_a_deadline_raises_while_the_upload_goes_on(local):
    take(local, 1)
    remote = Gate("gate-3")
    queue = UploadQueue(local, remote, "run", policy=FAST)
    queue.submit(1)
    with pytest.raises(StoreError, match="did not finish within"):
        queue.flush(0.1)
    remote.gate.set()
    queue.flush(10)
    assert reader.list_steps(remote, "run") == [1]


def test_throttled_writes_are_retried_until_they_land(local):
    take(local, 1)
    remote = Flaky("flaky", n=3)
    queue = UploadQueue(local, remote, "run", policy=FAST)
    queue.submit(1)
    queue.flush(10)
    assert reader.verify(remote, "run")["step"] == 1


def test_a_permanent_failure_is_reported_by_flush(local):
    take(local, 1)
    queue = UploadQueue(local, Denied("denied"), "run", policy=FAST)
    queue.submit(1)
    with pytest.raises(StoreError, match="access denied"):
        queue.flush(10)


def test_catch_up_after_a_restart_uploads_what_a_crash_left_behind(local):
    take(local, 1)
    take(local, 2)
    remote = MemoryStore("catch-up")
    queue = UploadQueue(local, remote, "run", policy=FAST)
    queue.catch_up()
    queue.flush(10)
    assert reader.list_steps(remote, "run") == [2]


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap():
    policy = RetryPolicy(attempts=10, base=0.5, cap=4.0)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (8, 4.0)]:
        waits = [policy.delay(attempt) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.8 and min(waits) < ceiling * 0.2  # jittered


def test_a_retry_wait_never_draws_from_the_training_random_generator():
    """An upload thread's jitter must not shift the stream a snapshot holds."""
    random.seed(5)
    before = random.getstate()
    RetryPolicy().delay(3)
    assert random.getstate() == before


def test_only_transient_errors_are_retried():
    calls = []

    def denied():
        calls.append(1)
        raise StoreError("access denied")

    with pytest.raises(StoreError):
        retry(denied, FAST, sleep=lambda _s: None)
    assert len(calls) == 1


def test_retrying_gives_up_after_the_last_attempt():
    calls = []

    def throttled():
        calls.append(1)
        raise TransientStoreError("503")

    with pytest.raises(TransientStoreError):
        retry(throttled, FAST, sleep=lambda _s: None)
    assert len(calls) == FAST.attempts

"""The persister never competes with the training step for a core: it and the threads it
starts (the blob writers) run at idle CPU priority, the training thread keeps its own."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from burst.snapshot import priority, tiers
from burst.snapshot.tiers import Captured, Tiers
from burst.store import LocalStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-thread scheduling attributes are Linux's")

RUN = "run"


@pytest.fixture(autouse=True)
def no_lingering_persister(monkeypatch):
    """Each test's persister leaves soon after its write, and is gone when the test ends."""
    monkeypatch.setattr(tiers, "LINGER_SECONDS", 0.05)
    monkeypatch.delenv(priority.ENV_PRIORITY, raising=False)  # the suite's "normal"
    before = set(threading.enumerate())  # an earlier test's run, never closed, may keep its own
    yield
    for thread in set(threading.enumerate()) - before:
        if thread.name == "burst-persist":
            thread.join(timeout=60)


class WatchedStore(LocalStore):
    """A local store that notes the scheduling policy and nice value of each writer."""

    def __init__(self, root: object) -> None:
        super().__init__(root)
        self.writers: dict[int, tuple[int, int]] = {}

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        tid = threading.get_native_id()
        self.writers[tid] = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
        super().put(key, data)


def captured(step: int) -> Captured:
    tensors = {f"w{i}": torch.full((64,), float(i + step)) for i in range(3)}
    tree = {name: {"$tensor": name} for name in tensors}
    return Captured(step, tree, tensors, {"reason": "test", "counters": {}})


def test_every_thread_writing_a_snapshot_runs_at_idle_cpu_priority(tmp_path):
    store = WatchedStore(tmp_path)
    persister = Tiers(store, RUN, keep=2)
    persister.persist(captured(1))
    persister.flush(timeout=60)
    assert store.writers  # blobs and the manifest were written
    assert set(store.writers.values()) == {(os.SCHED_IDLE, 19)}
    assert threading.get_native_id() not in store.writers  # all in the background


def test_the_persister_says_which_priorities_it_obtained(tmp_path):
    persister = Tiers(LocalStore(tmp_path), RUN, keep=2)
    persister.persist(captured(1))
    persister.flush(timeout=60)
    assert {"sched_idle", "nice19"} <= set(persister.priority.split(","))


def test_normal_priority_leaves_the_persister_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv(priority.ENV_PRIORITY, priority.NORMAL)
    store = WatchedStore(tmp_path)
    persister = Tiers(store, RUN, keep=2)
    persister.persist(captured(1))
    persister.flush(timeout=60)
    assert persister.priority == priority.NORMAL
    assert os.SCHED_IDLE not in {policy for policy, _nice in store.writers.values()}


def test_the_training_thread_keeps_its_priority(tmp_path):
    tid = threading.get_native_id()
    before = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
    persister = Tiers(LocalStore(tmp_path), RUN, keep=2)
    persister.persist(captured(1))
    persister.flush(timeout=60)
    assert (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)) == before

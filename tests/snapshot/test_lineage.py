"""Lineage fencing: two writers of one run, and only the newest launch publishes."""

from __future__ import annotations

import threading

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import lineage, reader, sync
from burst.snapshot.lineage import FencedError
from burst.snapshot.tiers import Captured, write_snapshot
from burst.store import LocalStore, open_store
from tests.helpers.store_servers import aws_env


def snap(store, step: int, launch: lineage.Lineage | dict | None) -> dict:
    """A real commit of a small snapshot at ``step``, stamped by ``launch`` (or by a
    launch's stamp alone: a process that is gone)."""
    tensors = {"w": torch.full((256,), float(step))}
    stamp = launch.stamp() if isinstance(launch, lineage.Lineage) else launch
    return write_snapshot(store, "run", Captured(step, {"w": {"$tensor": "w"}}, tensors,
                                                 {"reason": "periodic"}), stamp)


@pytest.fixture
def s3(seaweed, monkeypatch):
    aws_env(monkeypatch)
    return open_store(seaweed.url(), **seaweed.options())


def test_launches_racing_for_a_generation_on_s3_each_get_their_own(s3):
    held: list[lineage.Lineage] = []
    lock = threading.Lock()

    def launch() -> None:
        taken = lineage.take(s3, "run")
        with lock:
            held.append(taken)

    threads = [threading.Thread(target=launch) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(t.generation for t in held) == [1, 2, 3, 4, 5, 6]
    assert lineage.generations(s3, "run") == [1, 2, 3, 4, 5, 6]


def test_an_older_writer_on_s3_is_refused_and_never_becomes_newest(s3, tmp_path):
    """Writer A (the local training) and writer B (the node) push through their own local
    tiers to one S3 store, as the upload queue does."""
    tier_a, tier_b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    a = lineage.take(s3, "run")
    snap(tier_a, 5, a)
    sync.push_snapshot(tier_a, s3, "run", 5)
    b = lineage.take(s3, "run")  # the burst's node takes over, then resumes from step 5
    assert (a.generation, b.generation) == (1, 2)
    snap(tier_a, 20, a)  # A trained on meanwhile
    with pytest.raises(FencedError, match="replaced by generation 2") as refused:
        sync.push_snapshot(tier_a, s3, "run", 20)
    assert refused.value.own and a.fenced_by == 2 and b.fenced_by is None
    assert reader.list_steps(s3, "run") == [5]
    assert s3.list("run/uploads/") == []
    for step in (6, 7):
        snap(tier_b, step, b)
        assert sync.push_snapshot(tier_b, s3, "run", step).manifest == "written"
    newest = reader.read_manifest(s3, "run")
    assert newest["step"] == 7 and lineage.generation_of(newest) == 2


class TakeOverBeforeTheWrite(LocalStore):
    """A newer launch takes its generation between the fence check and the manifest write:
    the window the re-check closes."""

    def put(self, key, data):
        if "/snapshots/" in key and not lineage.generations(self, "run")[-1] > 1:
            lineage.take(LocalStore(self.root), "run")
        super().put(key, data)


def test_a_manifest_written_as_a_newer_launch_took_over_is_taken_back(tmp_path):
    a = lineage.take(LocalStore(tmp_path), "run")
    with pytest.raises(FencedError):
        snap(TakeOverBeforeTheWrite(tmp_path), 3, a)
    store = LocalStore(tmp_path)
    assert reader.list_steps(store, "run") == []
    assert a.fenced_by == 2


def test_a_writer_on_a_local_store_is_refused_once_replaced(tmp_path):
    store = LocalStore(tmp_path)
    a = lineage.take(store, "run")
    snap(store, 4, a)
    b = lineage.take(store, "run")
    with pytest.raises(FencedError):
        snap(store, 9, a)
    assert reader.list_steps(store, "run") == [4] and a.fenced_by == b.generation
    snap(store, 5, b)
    assert reader.read_manifest(store, "run")["step"] == 5


def _ended_launch(store) -> dict:
    """The stamp of a generation whose process is gone (a crash, or another machine)."""
    return lineage.take(store, "run").stamp()  # the Lineage object is gone at once


def test_a_restart_still_uploads_what_its_crashed_predecessor_left(tmp_path):
    remote, tier = LocalStore(tmp_path / "remote"), LocalStore(tmp_path / "tier")
    crashed = _ended_launch(remote)
    snap(tier, 8, crashed)  # committed locally, never uploaded
    restarted = lineage.take(remote, "run")
    assert sync.push_snapshot(tier, remote, "run", 8).manifest == "written"
    assert restarted.fenced_by is None


def test_a_snapshot_of_a_lineage_a_burst_replaced_is_never_published(tmp_path):
    remote, tier = LocalStore(tmp_path / "remote"), LocalStore(tmp_path / "tier")
    local = _ended_launch(remote)
    snap(tier, 8, local)
    _ended_launch(remote)  # the node
    held = lineage.take(remote, "run")  # the local machine, relaunched later
    with pytest.raises(FencedError, match="stale"):
        sync.push_snapshot(tier, remote, "run", 8)
    assert reader.list_steps(remote, "run") == [] and held.fenced_by is None


def test_a_push_from_no_launch_refuses_a_stale_snapshot_but_not_an_unstamped_one(tmp_path):
    """``burst push`` and the scheduler's backups hold no generation; snapshots older than
    fencing carry none and are never refused."""
    remote, tier = LocalStore(tmp_path / "remote"), LocalStore(tmp_path / "tier")
    old = _ended_launch(remote)
    _ended_launch(remote)
    snap(tier, 2, None)
    snap(tier, 3, old)
    assert sync.push_snapshot(tier, remote, "run", 2).manifest == "written"
    with pytest.raises(FencedError, match="stale"):
        sync.push_snapshot(tier, remote, "run", 3)
    assert reader.list_steps(remote, "run") == [2]


def test_a_snapshot_of_another_stores_lineage_is_not_judged_by_this_stores_numbers(tmp_path):
    """A local store's launch counts its own generations; the schedule uploads its snapshots
    to a remote where a node took generations of the remote's own."""
    remote, local = LocalStore(tmp_path / "remote"), LocalStore(tmp_path / "local")
    snap(local, 3, _ended_launch(local))
    _ended_launch(remote)
    _ended_launch(remote)
    assert sync.push_snapshot(local, remote, "run", 3).manifest == "written"


def test_a_generation_no_listable_one_can_follow_refuses_the_next_launch(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put("run/lineage/9999999999.json", b'{"token": "planted"}')  # the last 10 digits
    for _ in range(2):  # two writers: neither may take an unlisted, unfenced generation
        with pytest.raises(SnapshotError, match="generation 9999999999 is the last") as refused:
            lineage.take(store, "run")
        assert "\n" not in str(refused.value)
    assert store.list("run/lineage/") == ["run/lineage/9999999999.json"]
    assert lineage.generations(store, "run") == [9999999999]

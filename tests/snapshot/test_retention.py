"""Retention and GC: keep the last N and every Mth; never break a kept or uploading snapshot."""

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
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, retention, sync
from burst.snapshot.upload import UploadQueue
from burst.store import LocalStore, MemoryStore
from tests.helpers.snapshot_helpers import take


def state(step: int) -> dict[str, torch.Tensor]:
    """A tensor every snapshot shares (one blob for all) and one of the step's own."""
    return {"shared": torch.zeros(300_000), "w": torch.full((300_000,), float(step))}


def test_select_keeps_the_last_n():
    assert retention.select([10, 20, 30, 40], keep_last=2) == {30, 40}


def test_select_also_keeps_the_first_snapshot_in_every_window_of_m_steps():
    steps = [100, 250, 500, 750, 1000, 1250, 1500]
    assert retention.select(steps, keep_last=1, keep_every=1000) == {100, 1000, 1500}


def test_a_snapshot_kept_for_its_window_stays_kept_as_newer_ones_arrive():
    early = retention.select([100, 600], keep_last=1, keep_every=500)
    later = retention.select([100, 600, 700, 1100, 1200], keep_last=1, keep_every=500)
    assert {100, 600} <= early and {100, 600} <= later


def test_gc_deletes_dropped_manifests_and_only_unreferenced_blobs(tmp_path):
    store = LocalStore(tmp_path)
    for step in (1, 2, 3, 4):
        take(store, step, state(step))
    report = retention.gc(store, "run", keep_last=2)
    assert report.dropped == [1, 2] and reader.list_steps(store, "run") == [3, 4]
    assert report.blobs_deleted == 2  # the dropped snapshots' own 'w' blobs; 'shared' stays
    for step in (3, 4):
        reader.verify(store, "run", step)


def test_gc_dry_run_deletes_nothing(tmp_path):
    store = LocalStore(tmp_path)
    for step in (1, 2, 3):
        take(store, step, state(step))
    before = store.list("run/")
    report = retention.gc(store, "run", keep_last=1, dry_run=True)
    assert report.dropped == [1, 2] and report.blobs_deleted == 2
    assert store.list("run/") == before


def test_gc_never_deletes_blobs_of_an_upload_in_progress(tmp_path):
    local, remote = LocalStore(tmp_path), MemoryStore("gc-in-flight")
    take(local, 1, state(1))
    sync.push(local, remote, "run")
    manifest = take(local, 2, state(2))
    # An upload of step 2 that has sent its blobs but not yet its manifest:
    remote.put(fmt.marker_key("run", 2), json.dumps(
        {"time": time.time(), "blobs": sorted(manifest["blobs"])}).encode())
    for digest in manifest["blobs"]:
        sync.send_blob(local, remote, "run", digest, manifest["blobs"][digest]["size"],
                       algo=fmt.hash_of(manifest))
    report = retention.gc(remote, "run", keep_last=1)
    assert report.protected_in_flight >= 1
    assert all(remote.size(fmt.blob_key("run", d)) is not None for d in manifest["blobs"])


def test_a_push_repairs_a_blob_that_gc_deleted_under_it(tmp_path):
    local, remote = LocalStore(tmp_path), MemoryStore("gc-race")
    manifest = take(local, 1, state(1))
    digest = next(iter(manifest["blobs"]))

    class RacingGC(MemoryStore):
        """Deletes a blob right after the push checked it (the window GC races in)."""

        def put_if_absent(self, key, data):
            self.delete(fmt.blob_key("run", digest))
            return super().put_if_absent(key, data)

    racing = RacingGC("gc-race")
    sync.push(local, racing, "run")
    reader.verify(remote, "run", 1)


def test_markers_of_dead_uploads_expire(tmp_path):
    store = MemoryStore("gc-stale")
    take(store, 1, state(1))
    store.put(fmt.marker_key("run", 9), json.dumps({"time": 0, "blobs": ["a" * 64]}).encode())
    retention.gc(store, "run", keep_last=1)
    assert store.list("run/uploads/") == []


def test_gc_refuses_to_delete_every_snapshot(tmp_path):
    with pytest.raises(SnapshotError, match="keep at least one"):
        retention.gc(MemoryStore("gc-none"), "run", keep_last=0)


def test_an_unreadable_kept_manifest_stops_the_blob_sweep(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 1, state(1))
    take(store, 2, state(2))
    store.put(fmt.manifest_key("run", 2), b"{not json")
    blobs = store.list("run/blobs/")
    with pytest.raises(SnapshotError, match="not collecting garbage"):
        retention.gc(store, "run", keep_last=1)
    assert store.list("run/blobs/") == blobs


def _killed_during_the_marker_write(src: LocalStore, dst: LocalStore) -> Path:
    """A real push into ``dst`` SIGKILLed at its first kill point: inside the upload
    marker's write, after the temporary is written and before its rename."""
    code = ("import sys; from burst.snapshot import sync; from burst.store import LocalStore; "
            "sync.push(LocalStore(sys.argv[1]), LocalStore(sys.argv[2]), 'run')")
    done = subprocess.run([sys.executable, "-c", code, str(src.root), str(dst.root)],
                          env={**os.environ, "BURST_KILLPOINT": "1"}, check=False)
    assert done.returncode == -signal.SIGKILL
    (temporary,) = (dst.root / "run" / "uploads").glob(".*.tmp")
    return temporary


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_gc_sweeps_the_temporary_a_killed_write_left_at_once(tmp_path):
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    take(src, 1)
    take(dst, 0)  # a snapshot of its own, for GC to keep
    stale = _killed_during_the_marker_write(src, dst)  # seconds old: its writer is dead
    report = retention.gc(dst, "run", keep_last=1)
    assert report.temporaries_deleted == 1 and not stale.exists()


def test_a_sweep_never_takes_the_temporary_of_a_write_in_progress_however_idle(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 0)
    writing, release = threading.Event(), threading.Event()

    def fill(fd: int) -> None:  # a write stalled mid-way (a slow disk, a paused process)
        os.pwrite(fd, b"{}", 0)
        for temporary in (tmp_path / "run" / "uploads").glob(".*.tmp"):
            _age(temporary, retention.TEMP_TTL + 60)
        writing.set()
        release.wait(30)

    writer = threading.Thread(target=store.put_written,
                              args=("run/uploads/000000000002.json", 2, fill))
    writer.start()
    assert writing.wait(30)
    report = retention.gc(store, "run", keep_last=1)
    release.set()
    writer.join(30)
    assert report.temporaries_deleted == 0
    assert store.get("run/uploads/000000000002.json") == b"{}"  # the write landed


def test_opening_the_upload_queue_sweeps_stale_temporaries(tmp_path):
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    take(src, 1)
    stale = _killed_during_the_marker_write(src, dst)
    _age(stale, retention.TEMP_TTL + 60)
    queue = UploadQueue(src, dst, "run")
    queue.catch_up()
    queue.flush(timeout=30)
    assert not stale.exists()
    assert reader.list_steps(dst, "run") == [1]

"""``burst gc`` sweeps what killed writes left (burst.snapshot.sweep): the temporaries of
uploads killed mid-way (SFTP, against a real OpenSSH server; a local directory) and the
parts of sharded steps a crashed launch never committed; never a live upload's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from burst.cli import main
from burst.snapshot import format as fmt
from burst.snapshot import retention
from burst.snapshot.parts import Box, rank_marker_key, write_part
from burst.store import LocalStore, open_store
from burst.store.sftp import CHUNK
from tests.helpers.snapshot_helpers import take

RUN = "run"
DIGEST = "ab" * 32
SIZE = 3 << 20  # three of the SFTP store's chunks: the upload is killed after the first

# A child that uploads a blob over SFTP and stops once the server wrote its first chunk
# (the server's folder is on this machine), saying so; the test then SIGKILLs it there, as
# the OOM killer or a preempted VM would.
UPLOADER = textwrap.dedent("""
    import pathlib, sys, time
    from burst.store import open_store
    from burst.store.sftp import CHUNK
    url, config, source, key, served = sys.argv[1:6]
    sent = []
    def pace(n):
        while sent and not any(p.stat().st_size == CHUNK
                               for p in pathlib.Path(served).rglob(".*.tmp")):
            time.sleep(0.01)
        if sent:
            print("sent", flush=True)
            time.sleep(600)
        sent.append(n)
    open_store(url, ssh_config=config).put_file(key, source, pace=pace)
""")


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _temporaries(root: Path) -> list[Path]:
    return sorted(root.rglob(".*.tmp"))


@pytest.fixture
def sftp(sshd):
    store = open_store(sshd.url(), ssh_config=str(sshd.config))
    store.put(f"{RUN}/events.jsonl", b"{}\n")  # the run exists
    yield store, Path(store.root), sshd
    store.close()


@pytest.fixture
def killed_upload(sftp, tmp_path):
    """The temporary a real SFTP upload left when its process was SIGKILLed mid-way."""
    store, root, sshd = sftp
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(SIZE))
    child = subprocess.Popen([sys.executable, "-c", UPLOADER, store.url, str(sshd.config),
                              str(source), fmt.blob_key(RUN, DIGEST), str(root)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "sent\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(60)
    assert child.returncode == -signal.SIGKILL
    (temporary,) = _temporaries(root)
    return store, temporary


def _first_chunk_landed(root: Path) -> Path:
    """The one temporary under ``root``, once the server wrote the first chunk into it
    (then nothing writes it any more, so its age is what the test makes it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = _temporaries(root)
        if found and found[0].stat().st_size == CHUNK:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no temporary of {CHUNK} bytes under {root}")


def test_gc_sweeps_the_temporary_of_a_killed_sftp_upload_once_it_is_stale(killed_upload):
    store, temporary = killed_upload
    size = temporary.stat().st_size
    _age(temporary, retention.TEMP_TTL + 60)
    report = retention.gc(store, RUN, keep_last=1)
    assert not temporary.exists()
    assert (report.temporaries_deleted, report.temporary_bytes) == (1, size)
    assert store.size(fmt.blob_key(RUN, DIGEST)) is None  # the upload never landed


def test_gc_keeps_a_killed_sftp_uploads_temporary_while_it_is_fresh(killed_upload):
    store, temporary = killed_upload  # nothing on the server tells it from a live one yet
    report = retention.gc(store, RUN, keep_last=1)
    assert temporary.exists() and report.temporaries_deleted == 0


def test_a_dry_run_counts_the_temporaries_it_would_sweep_and_keeps_them(killed_upload):
    store, temporary = killed_upload
    _age(temporary, retention.TEMP_TTL + 60)
    report = retention.gc(store, RUN, keep_last=1, dry_run=True)
    assert temporary.exists() and report.temporaries_deleted == 1


def test_gc_keeps_a_live_sftp_uploads_temporary_its_marker_names_however_idle(sftp,
                                                                               tmp_path):
    store, root, _ = sftp
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(SIZE))
    store.put(fmt.marker_key(RUN, 5), fmt.encode_marker([DIGEST]))  # the push's marker
    first_sent, release = threading.Event(), threading.Event()

    def pace(_n: int) -> None:  # an upload stalled after its first chunk (a slow link)
        if first_sent.is_set():
            release.wait(60)
        first_sent.set()

    writer = threading.Thread(target=store.put_file,
                              args=(fmt.blob_key(RUN, DIGEST), source, pace))
    writer.start()
    try:
        assert first_sent.wait(60)
        temporary = _first_chunk_landed(root)
        _age(temporary, retention.TEMP_TTL + 60)  # idle past the age, by the server's clock
        report = retention.gc(store, RUN, keep_last=1)
    finally:
        release.set()
        writer.join(60)
    assert report.temporaries_deleted == 0
    assert store.size(fmt.blob_key(RUN, DIGEST)) == SIZE  # the upload landed whole


def test_gc_sweeps_a_local_uploads_temporary_killed_mid_blob_at_once(tmp_path):
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    take(src, 1, {"w": torch.ones(1000)})
    code = ("import sys; from burst.snapshot import sync; from burst.store import LocalStore; "
            "sync.push(LocalStore(sys.argv[1]), LocalStore(sys.argv[2]), 'run')")
    killed = subprocess.run([sys.executable, "-c", code, str(src.root), str(dst.root)],
                            env={**os.environ, "BURST_KILLPOINT": "local.put.synced#2"},
                            check=False)
    assert killed.returncode == -signal.SIGKILL
    (temporary,) = _temporaries(dst.root / RUN / "blobs")  # the marker went in, then a blob
    report = retention.gc(dst, RUN, keep_last=1)
    assert not temporary.exists() and report.temporaries_deleted == 1


def _part(store: LocalStore, step: int, rank: int, launch: str) -> None:
    """Rank ``rank`` of a two-rank launch writes its part of ``step`` (marker, blob, report)."""
    tensor = torch.full((4,), float(step * 10 + rank))
    write_part(store, RUN, step, rank, {"w": tensor}, {"w": Box((8,), (4 * rank,))},
               world_size=2, launch=launch)


def _age_markers(store: LocalStore, step: int, seconds: float) -> None:
    """The markers of ``step`` as ``seconds`` of age leave them (their own clock says so)."""
    for rank in range(2):
        key = rank_marker_key(RUN, step, rank)
        marker = json.loads(store.get(key))
        store.put(key, json.dumps({**marker, "time": marker["time"] - seconds}).encode())


def test_gc_sweeps_the_parts_a_crashed_sharded_launch_left_at_later_steps(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 10, {"w": torch.zeros(8)})
    for rank in range(2):  # launch A reported step 30 and crashed before rank 0 committed
        _part(store, 30, rank, "A")
    _age_markers(store, 30, retention.MARKER_TTL + 60)
    report = retention.gc(store, RUN, keep_last=1)
    assert store.list(f"{RUN}/parts/") == []
    assert report.parts_deleted == 2 and report.part_bytes > 0
    assert store.list(f"{RUN}/uploads/") == []  # their markers went as stale


def test_gc_keeps_the_parts_of_a_sharded_step_still_being_written(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 10, {"w": torch.zeros(8)})
    _part(store, 20, 0, "B")  # launch B: rank 0 reported step 20, rank 1 is still writing
    report = retention.gc(store, RUN, keep_last=1)
    assert store.list(f"{RUN}/parts/") == [fmt.part_key(RUN, 20, 0)]
    assert report.parts_deleted == 0
    assert report.protected_in_flight == 1  # and the blob its marker names stays


def test_burst_gc_says_what_it_swept(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 10, {"w": torch.zeros(8)})
    for rank in range(2):
        _part(store, 30, rank, "A")
    _age_markers(store, 30, retention.MARKER_TTL + 60)
    result = CliRunner().invoke(main, ["gc", RUN, "--store", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "swept 2 orphaned parts (" in result.output


def test_burst_gc_stale_after_sets_the_age_of_dead_uploads(tmp_path):
    store = LocalStore(tmp_path)
    take(store, 10, {"w": torch.zeros(8)})
    for rank in range(2):
        _part(store, 30, rank, "A")
    _age_markers(store, 30, 2 * 3600)  # two hours: fresh by the default, stale past 1h
    args = ["gc", RUN, "--store", str(tmp_path), "--json", "--dry-run"]
    default = json.loads(CliRunner().invoke(main, args).output)
    shorter = json.loads(CliRunner().invoke(main, [*args, "--stale-after", "1h"]).output)
    assert (default["parts_deleted"], shorter["parts_deleted"]) == (0, 2)
    assert len(store.list(f"{RUN}/parts/")) == 2  # a dry run deletes nothing


def test_burst_gc_refuses_a_stale_after_without_a_unit_in_one_line(tmp_path):
    take(LocalStore(tmp_path), 10, {"w": torch.zeros(8)})
    result = CliRunner().invoke(main, ["gc", RUN, "--store", str(tmp_path),
                                       "--stale-after", "5"])
    assert result.exit_code != 0
    assert "is not a duration" in result.output and "Traceback" not in result.output

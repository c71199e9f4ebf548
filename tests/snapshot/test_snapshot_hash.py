"""The hash that names snapshot blobs: BLAKE3 for new snapshots, recorded in the manifest;
SHA-256 snapshots (formats 1 and 2, written before) still read, verify, move and restore."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import blake3
import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, sync
from burst.snapshot.tensors import load_tensors
from burst.store import LocalStore, MemoryStore
from tests.cli.test_cli_core import invoke, one_line_error
from tests.helpers.snapshot_helpers import take

HASHERS = {fmt.SHA256: hashlib.sha256, fmt.BLAKE3: blake3.blake3}


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)  # a big tensor (its own blob), a small one (a pack)
    return {"big": torch.randn(3_000_000, generator=g), "small": torch.randn(10, generator=g)}


@pytest.fixture(params=[fmt.SHA256, fmt.BLAKE3])
def written(request, monkeypatch, tmp_path) -> tuple[LocalStore, dict]:
    """A snapshot written through the persister's path with each hash (SHA-256: the path
    every burst before BLAKE3 took, so the snapshot such a burst left behind)."""
    monkeypatch.setattr(fmt, "WRITE_HASH", request.param)
    store = LocalStore(tmp_path / "local")
    return store, take(store, 5, state())


def corrupt_one_blob(store: LocalStore, manifest: dict) -> None:
    digest = max(manifest["blobs"], key=lambda d: manifest["blobs"][d]["size"])
    path = Path(store.root) / fmt.blob_key("run", digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(data)


def test_a_new_snapshot_names_its_blobs_by_blake3_and_records_it(tmp_path):
    store = LocalStore(tmp_path)
    manifest = take(store, 1, state())
    assert manifest["hash"] == "blake3"
    for digest in manifest["blobs"]:
        assert blake3.blake3(store.get(fmt.blob_key("run", digest))).hexdigest() == digest


def test_a_blake3_snapshot_has_a_format_number_older_burst_refuses(tmp_path):
    # burst before BLAKE3 read formats 1 and 2 only, and said "upgrade burst" for others,
    # rather than taking every blob for corrupt and falling back to an older step
    assert take(LocalStore(tmp_path), 1, state())["format"] not in (1, 2)


def test_a_sha256_snapshot_keeps_the_format_older_burst_reads(monkeypatch, tmp_path):
    monkeypatch.setattr(fmt, "WRITE_HASH", fmt.SHA256)
    manifest = take(LocalStore(tmp_path), 1, state())
    assert manifest["format"] == 1 and "hash" not in manifest


def test_blobs_are_named_by_the_hash_their_manifest_records(written):
    store, manifest = written
    for digest in manifest["blobs"]:
        data = store.get(fmt.blob_key("run", digest))
        assert HASHERS[fmt.hash_of(manifest)](data).hexdigest() == digest


def test_a_snapshot_of_either_hash_verifies_and_restores(written):
    store, _ = written
    assert reader.verify(store, "run", 5)["step"] == 5
    loaded = load_tensors(store, reader.read_manifest(store, "run", 5))
    assert all(torch.equal(loaded[k], v) for k, v in state().items())


def test_a_corrupted_blob_fails_verification_under_either_hash(written):
    store, manifest = written
    corrupt_one_blob(store, manifest)
    with pytest.raises(SnapshotError, match="corrupt"):
        reader.verify(store, "run", 5)


def test_a_corrupted_blob_fails_the_restore_under_either_hash(written):
    store, manifest = written
    corrupt_one_blob(store, manifest)
    with pytest.raises(SnapshotError, match="corrupt"):
        load_tensors(store, reader.read_manifest(store, "run", 5))


def test_push_and_pull_check_blobs_by_the_recorded_hash(written, tmp_path):
    store, _ = written
    remote, back = MemoryStore("hash-sync"), LocalStore(tmp_path / "back")
    sync.push(store, remote, "run")
    assert sync.pull(remote, back, "run").step == 5
    loaded = load_tensors(back, reader.read_manifest(back, "run", 5))
    assert all(torch.equal(loaded[k], v) for k, v in state().items())


def test_a_push_refuses_a_corrupted_blob_under_either_hash(written):
    store, manifest = written
    corrupt_one_blob(store, manifest)
    with pytest.raises(SnapshotError, match="corrupt"):
        sync.push(store, MemoryStore("hash-push-corrupt"), "run")


def test_burst_verify_checks_each_snapshot_by_its_own_hash(written):
    store, _ = written
    result = invoke("verify", "run", "--store", str(store.root))
    assert result.exit_code == 0 and result.output.startswith("ok: run step 5")


def test_burst_verify_reports_a_corrupted_blob_in_one_line_under_either_hash(written):
    store, manifest = written
    corrupt_one_blob(store, manifest)
    code, line = one_line_error("verify", "run", "--store", str(store.root))
    assert code == 1 and "corrupt" in line


def manifest_bytes(**fields) -> bytes:
    base = {"format": 3, "hash": "blake3", "run_id": "r", "step": 1, "state": {},
            "tensors": {}, "blobs": {}}
    return json.dumps({k: v for k, v in {**base, **fields}.items() if v is not None}).encode()


def test_a_manifest_naming_an_unknown_hash_is_refused_asking_for_an_upgrade():
    with pytest.raises(SnapshotError, match=r"hash 'blake4'.*upgrade burst"):
        fmt.parse_manifest(manifest_bytes(hash="blake4"))


def test_a_blake3_format_must_name_its_hash():
    with pytest.raises(SnapshotError, match="hash None"):
        fmt.parse_manifest(manifest_bytes(hash=None))


def test_a_sha256_format_may_not_name_another_hash():
    with pytest.raises(SnapshotError, match="format 1, which is SHA-256"):
        fmt.parse_manifest(manifest_bytes(format=1))


def test_format_3_holds_whole_entries_only_as_format_1_did():
    entry = {"dtype": "float32", "shape": [1], "shards": []}
    with pytest.raises(SnapshotError, match="format 3 does not allow"):
        fmt.parse_manifest(manifest_bytes(tensors={"t": entry}))


def test_a_blake3_digest_is_the_same_on_one_thread_or_many():
    data = bytes(range(256)) * ((fmt.THREADED_HASH_BYTES + 12345) // 256)
    assert fmt.digest(data, fmt.BLAKE3) == blake3.blake3(data, max_threads=1).hexdigest()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_an_idle_priority_thread_hashes_on_its_own_thread(monkeypatch):
    asked, real = [], blake3.blake3

    class Recording:
        AUTO = real.AUTO

        def __init__(self, data, max_threads):
            asked.append(max_threads)
            self.inner = real(data, max_threads=1)

        def hexdigest(self):
            return self.inner.hexdigest()

    monkeypatch.setattr(fmt.blake3, "blake3", Recording)
    data = bytes(fmt.THREADED_HASH_BYTES)

    def idle() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        fmt.digest(data, fmt.BLAKE3)

    thread = threading.Thread(target=idle)
    thread.start()
    thread.join(timeout=60)
    fmt.digest(data, fmt.BLAKE3)
    assert asked == [1, real.AUTO]

"""Snapshots in a store: complete or invisible, verified on read, deduplicated, pruned."""

from __future__ import annotations

import os

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, tiers
from burst.snapshot.tensors import load_tensors
from burst.snapshot.tiers import Captured
from burst.store import LocalStore


def captured(step: int, **tensors: torch.Tensor) -> Captured:
    tree = {name: {"$tensor": name} for name in tensors}
    return Captured(step, tree, dict(tensors), {"reason": "test", "counters": {}})


def test_a_written_snapshot_reads_back_identically(tmp_path):
    store = LocalStore(tmp_path)
    big = torch.randn(fmt.PACK_THRESHOLD // 4 + 1)
    tiers.write_snapshot(store, "r", captured(5, big=big, small=torch.arange(3)))
    manifest = reader.read_manifest(store, "r")
    tensors = load_tensors(store, manifest)
    assert torch.equal(tensors["big"], big) and torch.equal(tensors["small"], torch.arange(3))


def test_bfloat16_and_empty_tensors_round_trip(tmp_path):
    store = LocalStore(tmp_path)
    t = torch.randn(5).to(torch.bfloat16)
    tiers.write_snapshot(store, "r", captured(1, bf=t, empty=torch.empty(0, 3), scalar=torch.tensor(2.5)))
    tensors = load_tensors(store, reader.read_manifest(store, "r"))
    assert torch.equal(tensors["bf"], t) and tensors["empty"].shape == (0, 3)
    assert tensors["scalar"].item() == 2.5 and tensors["scalar"].dim() == 0


def test_tensors_restored_from_a_local_store_hold_no_file_descriptors(tmp_path):
    store = LocalStore(tmp_path)
    blobs = {f"t{i}": torch.full((fmt.PACK_THRESHOLD // 4,), float(i)) for i in range(40)}
    tiers.write_snapshot(store, "r", captured(1, **blobs))
    before = len(os.listdir("/proc/self/fd"))
    tensors = load_tensors(store, reader.read_manifest(store, "r"))  # each maps its file
    assert len(os.listdir("/proc/self/fd")) - before < 5  # a limit of 1024 is common
    assert all(torch.equal(tensors[name], blobs[name]) for name in blobs)


def test_writing_to_a_restored_tensor_leaves_its_blob_intact(tmp_path):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, big=torch.zeros(fmt.PACK_THRESHOLD // 4)))
    load_tensors(store, reader.read_manifest(store, "r"))["big"].add_(1)
    assert torch.equal(load_tensors(store, reader.read_manifest(store, "r"))["big"],
                       torch.zeros(fmt.PACK_THRESHOLD // 4))


class ShrinkingStore(LocalStore):
    """Cuts each file short right after reporting its size: a blob truncated between
    the size check and the map."""

    def file_of(self, key):
        path, size = super().file_of(key)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return path, size


def test_a_blob_that_shrinks_before_it_is_mapped_fails_the_load_naming_it(tmp_path):
    tiers.write_snapshot(LocalStore(tmp_path), "r",
                         captured(1, big=torch.zeros(fmt.PACK_THRESHOLD // 4)))
    store = ShrinkingStore(tmp_path)
    manifest = reader.read_manifest(store, "r")
    digest = manifest["tensors"]["big"]["blob"]
    with pytest.raises(SnapshotError, match=f"{digest[:12]} is .* the manifest says"):
        load_tensors(store, manifest)


class FailingManifestStore(LocalStore):
    def put(self, key, data):
        if "/snapshots/" in key:
            raise OSError("disk full")
        super().put(key, data)


def test_a_snapshot_whose_manifest_write_fails_is_invisible(tmp_path):
    good = LocalStore(tmp_path)
    tiers.write_snapshot(good, "r", captured(1, w=torch.ones(4)))
    with pytest.raises(OSError):
        tiers.write_snapshot(FailingManifestStore(tmp_path), "r", captured(2, w=torch.zeros(4)))
    assert reader.list_steps(good, "r") == [1]
    assert torch.equal(load_tensors(good, reader.read_manifest(good, "r"))["w"],
                       torch.ones(4))


def test_unchanged_tensors_are_not_written_again(tmp_path):
    store = LocalStore(tmp_path)
    frozen = torch.randn(fmt.PACK_THRESHOLD // 4)
    tiers.write_snapshot(store, "r", captured(1, frozen=frozen, head=torch.zeros(8)))
    before = set(store.list("r/blobs/"))
    tiers.write_snapshot(store, "r", captured(2, frozen=frozen, head=torch.ones(8)))
    new = set(store.list("r/blobs/")) - before
    assert len(new) == 1  # only the pack holding the changed head


def blob_path(tmp_path, store, manifest, name):
    digest = manifest["tensors"][name]["blob"]
    return tmp_path / fmt.blob_key("r", digest), digest


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_blob_fails_the_load_naming_the_blob(tmp_path, damage):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, w=torch.randn(100)))
    manifest = reader.read_manifest(store, "r")
    path, digest = blob_path(tmp_path, store, manifest, "w")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-7]
    else:
        data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=digest[:12]):
        load_tensors(store, manifest)
    with pytest.raises(SnapshotError, match=digest[:12]):
        reader.verify(store, "r")


def test_a_missing_blob_fails_the_load(tmp_path):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, w=torch.randn(10)))
    manifest = reader.read_manifest(store, "r")
    path, _ = blob_path(tmp_path, store, manifest, "w")
    path.unlink()
    with pytest.raises(SnapshotError, match="missing"):
        load_tensors(store, manifest)


def test_listing_ignores_files_that_are_not_manifests(tmp_path):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(3, w=torch.ones(1)))
    (tmp_path / "r" / "snapshots" / ".000000000004.json.tmp").write_text("{")
    (tmp_path / "r" / "snapshots" / "notes.txt").write_text("x")
    assert reader.list_steps(store, "r") == [3]


def test_prune_keeps_the_newest_and_every_blob_they_reference(tmp_path):
    store = LocalStore(tmp_path)
    shared = torch.randn(fmt.PACK_THRESHOLD // 4)
    for step in range(1, 5):
        tiers.write_snapshot(store, "r", captured(step, shared=shared, own=torch.full((4,), step)))
    tiers.prune(store, "r", keep=2)
    assert reader.list_steps(store, "r") == [3, 4]
    for step in (3, 4):
        reader.verify(store, "r", step)
    assert len(store.list("r/blobs/")) == 3


def test_reading_another_runs_manifest_is_refused(tmp_path):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, w=torch.ones(1)))
    (tmp_path / "q" / "snapshots").mkdir(parents=True)
    (tmp_path / "q" / "snapshots" / "000000000001.json").write_bytes(
        (tmp_path / "r" / "snapshots" / "000000000001.json").read_bytes())
    with pytest.raises(SnapshotError, match="belongs to run 'r'"):
        reader.read_manifest(store, "q")


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "a\\b", "a/b c"])
def test_unsafe_keys_are_refused(tmp_path, key):
    with pytest.raises(SnapshotError, match="unsafe"):
        LocalStore(tmp_path).put(key, b"x")


def _two_snapshots_the_newer_cut_short(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, w=torch.zeros(fmt.PACK_THRESHOLD // 4 + 1)))
    tiers.write_snapshot(store, "r", captured(2, w=torch.ones(fmt.PACK_THRESHOLD // 4 + 1)))
    newer = reader.read_manifest(store, "r", 2)
    digest = newer["tensors"]["w"]["blob"]
    store.put(fmt.blob_key("r", digest), b"short")
    return store


def test_the_newest_complete_snapshot_skips_a_newer_one_with_a_blob_cut_short(tmp_path):
    said: list[str] = []
    newest = reader.newest_complete(_two_snapshots_the_newer_cut_short(tmp_path), "r",
                                    said.append)
    assert newest["step"] == 1
    assert "falling back to step 1" in said[0] and "bytes" in said[0]


def test_the_newest_complete_snapshot_checks_sizes_not_hashes(tmp_path):
    store = LocalStore(tmp_path)
    tiers.write_snapshot(store, "r", captured(1, w=torch.ones(8)))
    manifest = reader.read_manifest(store, "r", 1)
    digest = next(iter(manifest["blobs"]))
    key = fmt.blob_key("r", digest)
    store.put(key, bytes(len(store.get(key))))  # same size, other bytes: a read finds it
    assert reader.newest_complete(store, "r", print)["step"] == 1
    with pytest.raises(SnapshotError, match="corrupt"):
        reader.verify(store, "r", 1)

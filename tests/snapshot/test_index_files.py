"""A sharded snapshot's tensor table lives in index files beside its manifest
(burst.snapshot.index): the manifest counts files, not shards, and every reader sees the
table as if it were inline. Ranks are written one after another into a local store."""

from __future__ import annotations

import json

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import index, reader, retention, shards
from burst.snapshot.parts import Box, commit_parts, write_part
from burst.store.local import LocalStore

RUN = "run"
RANKS, TENSORS = 2, 12


def names() -> list[str]:
    return [f"state/model/t{i:02d}" for i in range(TENSORS)]


def whole(step: int, i: int) -> torch.Tensor:
    return torch.arange(8, dtype=torch.float32).reshape(4, 2) + 100 * step + i


def snapshot(store: LocalStore, step: int) -> dict:
    """Every tensor cut in two row halves, one per rank; rank 0 commits."""
    for rank in range(RANKS):
        tensors = {n: whole(step, i)[2 * rank : 2 * rank + 2].clone()
                   for i, n in enumerate(names())}
        boxes = {n: Box((4, 2), (2 * rank, 0)) for n in tensors}
        write_part(store, RUN, step, rank, tensors, boxes, world_size=RANKS)
    tree = {"model": {n: {"$tensor": n} for n in names()}}
    manifest = commit_parts(store, RUN, step, RANKS, tree=tree, meta={"reason": "periodic"},
                            timeout=30)
    assert manifest is not None
    return manifest


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def small_files(monkeypatch):
    """Five shards per index file: twelve two-shard tensors take six files."""
    monkeypatch.setattr(index, "SHARDS_PER_INDEX", 5)


def raw_manifest(store: LocalStore, step: int) -> dict:
    return json.loads(store.get(fmt.manifest_key(RUN, step)))


def test_the_stored_manifest_lists_index_files_and_no_shards(store, small_files):
    snapshot(store, 1)
    raw = raw_manifest(store, 1)
    assert raw["tensors"] == {} and len(raw["indexes"]) == 6
    assert set(raw["blobs"]) == set(raw["indexes"])


def test_a_read_manifest_holds_the_whole_table_and_every_blob(store, small_files):
    committed = snapshot(store, 1)
    stored = reader.read_manifest(store, RUN, 1)
    assert stored == committed and sorted(stored["tensors"]) == names()
    assert all(len(stored["tensors"][n]["shards"]) == RANKS for n in names())
    assert set(raw_manifest(store, 1)["indexes"]) < set(stored["blobs"])
    for i, name in enumerate(names()):
        assert torch.equal(shards.read_whole(store, stored, name), whole(1, i)), name


def test_index_files_are_blobs_named_by_their_hash(store):
    snapshot(store, 1)
    raw = raw_manifest(store, 1)
    for digest in raw["indexes"]:
        data = store.get(fmt.blob_key(RUN, digest))
        assert fmt.digest(data, raw["hash"]) == digest


def test_verify_checks_the_index_files_too(store):
    snapshot(store, 1)
    digest = raw_manifest(store, 1)["indexes"][0]
    path = store.root / fmt.blob_key(RUN, digest)
    path.write_bytes(path.read_bytes()[:-1] + b" ")  # same size, another hash
    with pytest.raises(SnapshotError, match=f"blob {digest[:12]} is corrupt"):
        reader.verify(store, RUN, 1)


def test_a_missing_index_file_makes_the_snapshot_fall_back(store):
    snapshot(store, 1)
    snapshot(store, 2)
    store.delete(fmt.blob_key(RUN, raw_manifest(store, 2)["indexes"][0]))
    skipped: list[str] = []
    chosen = reader.newest_complete(store, RUN, log=skipped.append)
    assert chosen is not None and chosen["step"] == 1
    assert len(skipped) == 1 and f"{RUN}@2 is unusable" in skipped[0]


def test_gc_keeps_the_index_files_and_the_blobs_they_list(store):
    snapshot(store, 1)
    kept = snapshot(store, 2)
    report = retention.gc(store, RUN, keep_last=1)
    assert report.dropped == [1]
    for digest, info in kept["blobs"].items():
        assert store.size(fmt.blob_key(RUN, digest)) == info["size"], digest


def test_a_tensor_listed_in_two_index_files_is_refused():
    manifest = {"run_id": RUN, "step": 1, "tensors": {}, "blobs": {},
                "indexes": ["a" * 64, "b" * 64]}
    doc = {"tensors": {"t": {"dtype": "float32", "shape": []}}, "blobs": {}}
    with pytest.raises(SnapshotError, match="listed twice"):
        index.expand(manifest, [doc, doc])


def test_an_index_file_of_another_step_is_refused(store):
    snapshot(store, 1)
    raw = raw_manifest(store, 1)
    digest = raw["indexes"][0]
    data = store.get(fmt.blob_key(RUN, digest))
    with pytest.raises(SnapshotError, match="index file"):
        index.parse(data, {**raw, "step": 2}, digest, "snapshot run@2")


def test_indexes_must_name_blobs_of_the_manifest():
    manifest = {"format": fmt.SHARDED_FORMAT_VERSION, "blobs": {}, "indexes": ["c" * 64]}
    with pytest.raises(SnapshotError, match="malformed 'indexes'"):
        index.listed(manifest, "snapshot run@1")


def test_index_files_declared_past_the_total_cap_are_refused_unread(monkeypatch):
    monkeypatch.setattr(index, "MAX_INDEX_BYTES", 100)
    manifest = {"format": fmt.SHARDED_FORMAT_VERSION, "blobs": {"d" * 64: {"size": 101}},
                "indexes": ["d" * 64]}
    with pytest.raises(SnapshotError, match="bytes of index files"):
        index.listed(manifest, "snapshot run@1")

"""Format 2: sharded tensor entries, chunk hashes, and the helpers writers and readers share."""

from __future__ import annotations

import hashlib
import json

import blake3
import pytest

from burst.errors import SnapshotError
from burst.snapshot import format as fmt

A, B = "a" * 64, "b" * 64


def shard(offsets, sizes, blob=A, offset=0, itemsize=4) -> dict:
    n = 1
    for s in sizes:
        n *= s
    return {"offsets": offsets, "sizes": sizes, "blob": blob, "offset": offset,
            "nbytes": n * itemsize}


def manifest(shards=None, *, version=2, blobs=None, shape=(4, 3)) -> bytes:
    """A 4x3 float32 tensor in two row shards (blob A: rows 0-1, blob B: rows 2-3)."""
    if shards is None:
        shards = [shard([0, 0], [2, 3]), shard([2, 0], [2, 3], blob=B)]
    return json.dumps({
        "format": version, "run_id": "r", "step": 1, "state": {},
        "blobs": blobs if blobs is not None else {A: {"size": 64}, B: {"size": 64}},
        "tensors": {"t": {"dtype": "float32", "shape": list(shape), "shards": shards},
                    "w": {"blob": A, "dtype": "float32", "shape": [2], "offset": 0,
                          "nbytes": 8}},
    }).encode()


def test_a_sharded_manifest_parses_beside_whole_entries():
    parsed = fmt.parse_manifest(manifest())
    assert len(parsed["tensors"]["t"]["shards"]) == 2
    assert parsed["tensors"]["w"]["blob"] == A


def test_a_v1_manifest_may_not_hold_a_sharded_entry():
    with pytest.raises(SnapshotError, match="format 1 does not allow"):
        fmt.parse_manifest(manifest(version=1))


def test_formats_beyond_the_readable_ones_are_refused():
    assert fmt.READABLE_VERSIONS == (1, 2, 3, 4)
    with pytest.raises(SnapshotError, match="format 5"):
        fmt.parse_manifest(manifest(version=5))


@pytest.mark.parametrize("shards, message", [
    ([shard([0, 0], [2, 3]), shard([2, 1], [2, 3], blob=B)], "outside the tensor's shape"),
    ([shard([0, 0], [3, 3]), shard([2, 0], [1, 3], blob=B)], "overlap"),
    ([shard([0, 0], [2, 3]), shard([3, 0], [1, 3], blob=B)], "hold 9 elements"),
    ([shard([0, 0], [2, 3]), {**shard([2, 0], [2, 3], blob=B), "nbytes": 20}], "declares 20"),
    ([shard([0, 0], [2, 3]), shard([2, 0], [2, 3], blob=B, offset=44)], "outside its blob"),
    ([shard([0, 0], [2, 3]), shard([2, 0], [2, 3], blob="c" * 64)], "no valid blob range"),
    ([shard([0, 0], [2, 3]), shard([2], [2], blob=B)], "malformed offsets or sizes"),
    ([shard([0, 0], [2, 3]), shard([2, -1], [2, 3], blob=B)], "malformed offsets or sizes"),
    ([shard([0, 0], [2, 3]), "rows 2-3"], "shard 1 is malformed"),
])
def test_shards_that_do_not_tile_the_tensor_exactly_are_refused(shards, message):
    with pytest.raises(SnapshotError, match=message):
        fmt.parse_manifest(manifest(shards))


def test_overlapping_column_shards_are_found_within_a_row_span():
    blobs = {A: {"size": 64}, B: {"size": 64}}
    grid = [shard([0, 0], [4, 1]), shard([0, 1], [4, 2], blob=B), shard([0, 3], [3, 1]),
            shard([1, 1], [1, 1])]  # inside the second; the volumes still add up to 16
    with pytest.raises(SnapshotError, match="shards 1 and 3 of tensor 't' overlap"):
        fmt.parse_manifest(manifest(grid, shape=(4, 4), blobs=blobs))
    tiled = [shard([0, 0], [4, 1]), shard([0, 1], [2, 2], blob=B), shard([2, 1], [2, 2], blob=B)]
    assert fmt.parse_manifest(manifest(tiled, shape=(4, 3), blobs=blobs))


def test_shards_count_against_the_manifest_entry_cap(monkeypatch):
    monkeypatch.setattr(fmt, "MAX_MANIFEST_ENTRIES", 2)
    with pytest.raises(SnapshotError, match="more than 2 tensor shards"):
        fmt.parse_manifest(manifest())  # two shards plus one whole entry


@pytest.mark.parametrize("chunks, message", [
    (["c" * 64, "d" * 64], "malformed chunk hashes"),  # one piece: one hash
    (["C" * 64], "malformed chunk hashes"),
    ("c" * 64, "malformed chunk hashes"),
])
def test_chunk_hashes_must_name_each_piece_of_the_blob(chunks, message):
    blobs = {A: {"size": 24, "chunks": chunks}, B: {"size": 24}}
    with pytest.raises(SnapshotError, match=message):
        fmt.parse_manifest(manifest(blobs=blobs))


def test_a_blob_with_one_hash_per_chunk_parses():
    blobs = {A: {"size": 24, "chunks": ["c" * 64]}, B: {"size": 0, "chunks": []}}
    shards = [shard([0, 0], [2, 3]), shard([2, 0], [2, 3], offset=0)]
    assert fmt.parse_manifest(manifest(shards, blobs=blobs))["blobs"][A]["chunks"]


def test_chunk_digests_hash_each_chunk_bytes_piece():
    data = bytes(range(256)) * ((fmt.CHUNK_BYTES * 2 + 1000) // 256)
    digests = fmt.chunk_digests(data, fmt.SHA256)
    assert len(digests) == 3
    assert digests[1] == hashlib.sha256(data[fmt.CHUNK_BYTES:2 * fmt.CHUNK_BYTES]).hexdigest()
    assert fmt.chunk_digests(b"", fmt.SHA256) == []


def test_chunk_digests_use_the_hash_they_are_given():
    data = bytes(range(256)) * ((fmt.CHUNK_BYTES + 1000) // 256)
    digests = fmt.chunk_digests(data, fmt.BLAKE3)
    assert digests == [blake3.blake3(data[:fmt.CHUNK_BYTES]).hexdigest(),
                       blake3.blake3(data[fmt.CHUNK_BYTES:]).hexdigest()]


def test_blob_info_lists_chunks_only_for_blobs_beyond_one_chunk():
    assert fmt.blob_info(b"x" * 100, fmt.BLAKE3) == {"size": 100}
    big = fmt.blob_info(bytearray(fmt.CHUNK_BYTES + 1), fmt.BLAKE3)
    assert big["size"] == fmt.CHUNK_BYTES + 1 and len(big["chunks"]) == 2


def test_entry_sizes_and_shards_treat_whole_and_sharded_entries_alike():
    parsed = fmt.parse_manifest(manifest())
    whole, sharded = parsed["tensors"]["w"], parsed["tensors"]["t"]
    assert fmt.entry_nbytes(whole) == 8 and fmt.entry_nbytes(sharded) == 48
    assert fmt.entry_shards(whole) == [{"offsets": [0], "sizes": [2], "blob": A, "offset": 0,
                                        "nbytes": 8}]
    assert fmt.entry_shards(sharded) is sharded["shards"]


def test_part_keys_are_fixed_width_under_the_steps_parts_prefix():
    assert fmt.part_key("run", 42, 3) == "run/parts/000000000042/000003.json"
    assert fmt.part_key("run", 42, 3).startswith(fmt.parts_prefix("run", 42))
    with pytest.raises(SnapshotError):
        fmt.part_key("run", 42, -1)

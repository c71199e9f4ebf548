"""Reading regions of snapshot tensors across shards (burst.snapshot.shards), against real
stores: manifests are built by hand here (tensor -> boxes -> blobs with chunk hashes)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner

from burst.cli import main
from burst.errors import SnapshotError
from burst.plan.memory import static_bytes
from burst.snapshot import format as fmt
from burst.snapshot import reader
from burst.snapshot.shards import BlobCache, read_region, read_whole
from burst.snapshot.tensors import dtype_name, load_tensors, pull_tensors, tensor_bytes
from burst.store import open_store
from burst.store.local import LocalStore
from tests.helpers.store_servers import aws_env

RUN = "run"
ROWS, COLS = 4096, 1024  # float32: 16 MiB, four row shards of 4 MiB
PAD = 1000  # bytes before a blob's first tensor: shards straddle chunk boundaries


def row_split(rows: int, parts: int) -> list[tuple[int, int]]:
    """(start, count) of each of ``parts`` near-equal row blocks (the first ones larger)."""
    base, extra = divmod(rows, parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (i < extra)
        out.append((start, n))
        start += n
    return out


def write_snapshot(store, tensors: dict[str, torch.Tensor], boxes: dict[str, list | None], *,
                   step: int = 1, version: int = 2) -> dict:
    """Write ``tensors`` as a snapshot: each box (offsets, sizes, rank) of a tensor lands in
    that rank's blob (``None``: the tensor whole, in rank 0's); return the parsed manifest."""
    blobs: dict[int, bytearray] = {}
    placed: dict[str, list] = {}
    for name, tensor in tensors.items():
        for offsets, sizes, rank in boxes[name] or [([0] * tensor.dim(), list(tensor.shape), 0)]:
            region = tensor[tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))]
            data = tensor_bytes(region.contiguous())
            blob = blobs.setdefault(rank, bytearray(os.urandom(PAD)))
            blob.extend(bytes(-len(blob) % fmt.ALIGN))
            placed.setdefault(name, []).append((offsets, sizes, rank, len(blob), len(data)))
            blob.extend(data)
    algo = fmt.SHA256 if version in (1, 2) else fmt.BLAKE3  # formats 3, 4 record it
    digests = {rank: fmt.digest(data, algo) for rank, data in blobs.items()}
    for rank, data in blobs.items():
        store.put(fmt.blob_key(RUN, digests[rank]), data)
    entries = {}
    for name, pieces in placed.items():
        dtype, shape = dtype_name(tensors[name].dtype), list(tensors[name].shape)
        shards = [{"offsets": o, "sizes": s, "blob": digests[r], "offset": at, "nbytes": n}
                  for o, s, r, at, n in pieces]
        if boxes[name] is None:
            entries[name] = {"dtype": dtype, "shape": shape, "blob": shards[0]["blob"],
                             "offset": shards[0]["offset"], "nbytes": shards[0]["nbytes"]}
        else:
            entries[name] = {"dtype": dtype, "shape": shape, "shards": shards}
    infos = {digests[r]: (fmt.blob_info(d, algo) if version in fmt.SHARDED_VERSIONS
                          else {"size": len(d)})
             for r, d in blobs.items()}
    manifest = {"format": version, "run_id": RUN, "step": step, "state": {},
                "tensors": entries, "blobs": infos, **({"hash": algo} if version > 2 else {})}
    store.put(fmt.manifest_key(RUN, step), fmt.encode_manifest(manifest))
    parsed = reader.read_manifest(store, RUN, step)
    assert parsed is not None
    return parsed


def rows_of(rows: int, parts: int, cols: int = COLS) -> list:
    """Row shards of a ``rows`` x ``cols`` tensor, one per rank."""
    return [([start, 0], [n, cols], rank) for rank, (start, n) in enumerate(row_split(rows, parts))]


@pytest.fixture(scope="module")
def big() -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def store(tmp_path):
    return open_store(tmp_path / "store")


class CountingStore(LocalStore):
    """A local store that counts the bytes read through each kind of read."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.ranged = 0
        self.whole = 0

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self.ranged += length
        return super().read_range(key, start, length)

    def read_into(self, key: str, buffer: memoryview) -> int:
        self.whole += len(buffer)
        return super().read_into(key, buffer)


def test_a_region_straddling_three_shards_holds_exactly_their_rows(store, big):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)})
    assert all("chunks" in info for info in manifest["blobs"].values())
    region = read_region(store, manifest, "w", [1000, 0], [1100, COLS])
    assert torch.equal(region, big[1000:2100])


def test_four_shards_read_back_as_three_ranks_regions(store, big):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)})
    parts = [read_region(store, manifest, "w", [start, 0], [n, COLS])
             for start, n in row_split(ROWS, 3)]
    assert [p.shape[0] for p in parts] == [1366, 1365, 1365]
    assert torch.equal(torch.cat(parts), big)


def test_a_few_rows_read_only_the_chunks_they_touch(tmp_path, big):
    store = CountingStore(tmp_path / "store")
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)})
    assert torch.equal(read_region(store, manifest, "w", [10, 0], [4, COLS]), big[10:14])
    assert 0 < store.ranged <= fmt.CHUNK_BYTES and store.whole == 0


def test_a_whole_v1_entry_is_read_by_rows(store):
    tensor = torch.arange(600, dtype=torch.int64).reshape(20, 30)
    manifest = write_snapshot(store, {"t": tensor}, {"t": None}, version=1)
    assert manifest["format"] == 1 and "blob" in manifest["tensors"]["t"]
    assert torch.equal(read_region(store, manifest, "t", [5, 0], [4, 30]), tensor[5:9])


def test_a_2d_box_gathers_its_part_of_each_tile(store):
    tensor = torch.randn(64, 48).to(torch.bfloat16)  # a dtype numpy has not
    tiles = [([r, c], [32, 24], rank) for rank, (r, c)
             in enumerate([(0, 0), (0, 24), (32, 0), (32, 24)])]
    manifest = write_snapshot(store, {"t": tensor}, {"t": tiles})
    region = read_region(store, manifest, "t", [10, 20], [30, 25])
    assert region.dtype == torch.bfloat16 and region.is_contiguous()
    assert torch.equal(region, tensor[10:40, 20:45])


def test_whole_tensors_of_every_rank_and_dimension_come_back(store):
    tensors = {"scalar": torch.tensor(3.5), "vector": torch.arange(10, dtype=torch.int32),
               "empty": torch.empty(0, 4), "cube": torch.randn(6, 4, 5)}
    boxes = {"scalar": [([], [], 1)], "vector": [([0], [7], 0), ([7], [3], 1)],
             "empty": [([0, 0], [0, 4], 0)], "cube": [([0, 0, 0], [6, 4, 2], 0),
                                                      ([0, 0, 2], [6, 4, 3], 1)]}
    manifest = write_snapshot(store, tensors, boxes)
    for name, tensor in tensors.items():
        assert torch.equal(read_whole(store, manifest, name), tensor), name


@pytest.mark.parametrize("version", [2, 4])  # SHA-256, BLAKE3 chunk hashes
def test_a_corrupted_chunk_names_its_blob(store, big, version):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)}, version=version)
    digest = manifest["tensors"]["w"]["shards"][1]["blob"]
    key = fmt.blob_key(RUN, digest)
    data = bytearray(store.get(key))
    data[fmt.CHUNK_BYTES + 5] ^= 1
    store.put(key, data)
    with pytest.raises(SnapshotError, match=f"blob {digest[:12]}.*corrupt"):
        read_region(store, manifest, "w", [ROWS // 4, 0], [ROWS // 4, COLS])


@pytest.mark.parametrize("version", [2, 4])
def test_a_corrupted_blob_without_chunks_is_refused(store, version):
    tensor = torch.arange(100, dtype=torch.float32)
    manifest = write_snapshot(store, {"t": tensor}, {"t": None}, version=version)
    digest = manifest["tensors"]["t"]["blob"]
    data = bytearray(store.get(fmt.blob_key(RUN, digest)))
    data[-1] ^= 1
    store.put(fmt.blob_key(RUN, digest), data)
    with pytest.raises(SnapshotError, match=f"blob {digest[:12]} is corrupt"):
        read_region(store, manifest, "t", [0], [10])


def test_a_missing_blob_is_a_snapshot_error(store, big):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)})
    digest = manifest["tensors"]["w"]["shards"][3]["blob"]
    store.delete(fmt.blob_key(RUN, digest))
    with pytest.raises(SnapshotError, match=f"blob {digest[:12]}.*missing"):
        read_whole(store, manifest, "w")


def test_an_element_no_shard_covers_is_a_snapshot_error(store):
    tensor = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    manifest = write_snapshot(store, {"t": tensor}, {"t": [([0, 0], [2, 3], 0),
                                                          ([2, 0], [2, 3], 1)]})
    del manifest["tensors"]["t"]["shards"][1]  # what parsing would refuse
    with pytest.raises(SnapshotError, match="uncovered"):
        read_region(store, manifest, "t", [1, 0], [2, 3])


def test_a_region_outside_the_tensor_is_refused(store):
    manifest = write_snapshot(store, {"t": torch.zeros(4, 3)}, {"t": None})
    with pytest.raises(ValueError, match="not inside"):
        read_region(store, manifest, "t", [3, 0], [2, 3])


def test_a_pack_without_chunks_is_read_once_for_all_its_tensors(tmp_path):
    store = CountingStore(tmp_path / "store")
    tensors = {f"b{i}": torch.full((8,), float(i)) for i in range(20)}
    manifest = write_snapshot(store, tensors, dict.fromkeys(tensors))
    size = next(iter(manifest["blobs"].values()))["size"]
    cache = BlobCache()
    for name, tensor in tensors.items():
        assert torch.equal(read_whole(store, manifest, name, blobs=cache), tensor)
    assert store.whole == size and store.ranged == 0


def test_small_tensors_in_a_chunked_pack_read_each_chunk_once(tmp_path):
    store = CountingStore(tmp_path / "store")
    tensors = {f"b{i}": torch.full((50_000,), float(i)) for i in range(40)}  # an 8 MB pack
    manifest = write_snapshot(store, tensors, {n: [([0], [50_000], 0)] for n in tensors})
    (size, chunks), = ((i["size"], i["chunks"]) for i in manifest["blobs"].values())
    cache = BlobCache()
    for name, tensor in tensors.items():
        assert torch.equal(read_whole(store, manifest, name, blobs=cache), tensor)
    assert len(chunks) == 2 and store.ranged == size and store.whole == 0


def test_regions_come_from_ranged_gets_on_s3(moto_s3, monkeypatch, big):
    aws_env(monkeypatch)
    s3 = open_store(moto_s3.url(), **moto_s3.options())
    manifest = write_snapshot(s3, {"w": big[:2048]}, {"w": rows_of(2048, 2)})
    assert torch.equal(read_region(s3, manifest, "w", [1000, 0], [100, COLS]), big[1000:1100])


def mixed(store) -> tuple[dict, dict]:
    """A format 2 snapshot as two ranks write one: row shards, a column-split tensor,
    and replicated tensors whole in one rank's pack beside its shard pieces."""
    tensors = {"w": torch.randn(300, 40), "v": torch.randn(8, 6).to(torch.bfloat16),
               "bias": torch.arange(5, dtype=torch.float32), "step": torch.tensor(7)}
    boxes = {"w": [([0, 0], [150, 40], 0), ([150, 0], [150, 40], 1)],
             "v": [([0, 0], [8, 2], 1), ([0, 2], [8, 4], 0)], "bias": None, "step": None}
    return tensors, write_snapshot(store, tensors, boxes)


def test_one_process_loads_a_sharded_snapshot_whole(store):
    tensors, manifest = mixed(store)
    loaded = load_tensors(store, manifest)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_pulled_sharded_snapshot_restores_from_the_pulled_blobs(tmp_path):
    remote = open_store(tmp_path / "remote")
    tensors, _ = mixed(remote)
    _, _, loaded = pull_tensors(remote, open_store(tmp_path / "local"), RUN)
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor), name


def test_verify_accepts_a_sharded_snapshot_and_lists_its_blobs(store, big):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)})
    assert reader.verify(store, RUN, 1)["format"] == 2
    shard_blobs = {s["blob"] for s in manifest["tensors"]["w"]["shards"]}
    assert reader.referenced_blobs(store, RUN, 1) == shard_blobs == set(manifest["blobs"])


@pytest.mark.parametrize("version", [2, 4])
def test_verify_refuses_chunk_hashes_that_do_not_match_the_blob(store, big, version):
    manifest = write_snapshot(store, {"w": big}, {"w": rows_of(ROWS, 4)}, version=version)
    digest, info = next(iter(manifest["blobs"].items()))
    info["chunks"][-1] = "0" * 64
    store.put(fmt.manifest_key(RUN, 1), fmt.encode_manifest(manifest))
    with pytest.raises(SnapshotError, match=f"blob {digest[:12]} has chunk hashes"):
        reader.verify(store, RUN, 1)


def test_burst_show_prints_a_sharded_snapshot(store, tmp_path):
    mixed(store)
    result = CliRunner().invoke(main, ["show", RUN, "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["format"] == 2 and "tensors" not in shown


def test_the_planner_counts_a_sharded_tensor_at_its_global_size(store):
    whole = write_snapshot(store, {"state/model/w": torch.zeros(300, 40)},
                           {"state/model/w": None}, step=1)
    sharded = write_snapshot(store, {"state/model/w": torch.zeros(300, 40)},
                             {"state/model/w": rows_of(300, 3, 40)}, step=2)
    assert static_bytes(sharded["tensors"]) == static_bytes(whole["tensors"])
    assert static_bytes(sharded["tensors"]).params == 300 * 40 * 4

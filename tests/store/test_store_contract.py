"""The Store contract, run over every backend: local, memory, S3 (moto, SeaweedFS over TLS,
OSS dialect on SeaweedFS) and SFTP on a real OpenSSH server."""

from __future__ import annotations

import os
import uuid

import pytest
import torch

from burst.errors import SnapshotError, StoreError
from burst.snapshot import reader
from burst.snapshot import tiers as snapshot
from burst.snapshot.tensors import load_tensors
from burst.snapshot.tiers import Captured
from burst.store import open_store
from tests.helpers.store_servers import aws_env

BACKENDS = ["local", "memory", "moto", "seaweed", "oss-on-seaweed", "sftp"]
SMALL_PART = 5 << 20  # S3's smallest multipart part: a 12 MiB object goes up in 3 parts


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path, monkeypatch):
    """A fresh, empty store of each backend (a unique prefix on the shared servers)."""
    kind = request.param
    aws_env(monkeypatch)
    if kind == "local":
        return open_store(tmp_path / "store")
    if kind == "memory":
        return open_store(f"memory://{uuid.uuid4().hex}")
    if kind == "moto":
        server = request.getfixturevalue("moto_s3")
        return open_store(server.url(), **server.options(part_size=SMALL_PART))
    if kind == "seaweed":
        server = request.getfixturevalue("seaweed")
        return open_store(server.url(), **server.options(part_size=SMALL_PART))
    if kind == "oss-on-seaweed":
        server = request.getfixturevalue("seaweed")
        url = server.url().replace("s3://", "oss://")
        return open_store(url, **server.options(part_size=SMALL_PART))
    sshd = request.getfixturevalue("sshd")
    return open_store(sshd.url(), ssh_config=str(sshd.config))


def test_a_written_object_reads_back_byte_for_byte(store):
    data = os.urandom(1000)
    store.put("run/a/b.bin", data)
    assert store.get("run/a/b.bin") == data
    assert store.size("run/a/b.bin") == 1000


def test_put_replaces_an_existing_object(store):
    store.put("run/x", b"first")
    store.put("run/x", b"second")
    assert store.get("run/x") == b"second"


def test_a_missing_object_is_a_key_error_and_has_no_size(store):
    with pytest.raises(KeyError):
        store.get("run/missing")
    with pytest.raises(KeyError):
        store.read_into("run/missing", memoryview(bytearray(4)))
    assert store.size("run/missing") is None


def test_put_if_absent_writes_once_and_never_overwrites(store):
    assert store.put_if_absent("run/m.json", b"mine") is True
    assert store.put_if_absent("run/m.json", b"theirs") is False
    assert store.get("run/m.json") == b"mine"


def test_list_returns_keys_under_a_prefix_sorted(store):
    for key in ("r/snapshots/2.json", "r/snapshots/1.json", "r/blobs/ab/abc", "rx/other"):
        store.put(key, b"x")
    assert store.list("r/snapshots/") == ["r/snapshots/1.json", "r/snapshots/2.json"]
    assert store.list("r/") == ["r/blobs/ab/abc", "r/snapshots/1.json", "r/snapshots/2.json"]
    assert store.list("nothing/") == []


def test_delete_removes_and_tolerates_a_missing_key(store):
    store.put("run/d", b"x")
    store.delete("run/d")
    store.delete("run/d")
    assert store.size("run/d") is None and store.list("run/") == []


def test_a_large_object_round_trips_through_parts_and_ranges(store):
    data = os.urandom(12 << 20)  # above the part size: multipart up, ranged GETs down
    store.put("run/big", data)
    buffer = bytearray(len(data))
    assert store.read_into("run/big", memoryview(buffer)) == len(data)
    assert buffer == data


def test_a_file_put_lands_byte_for_byte_and_every_byte_is_paced(store, tmp_path):
    data = os.urandom((12 << 20) + 17)  # above the part size: a multipart upload on S3
    path = tmp_path / "wheel.whl"
    path.write_bytes(data)
    paced: list[int] = []
    store.put_file("wheels/ab/wheel.whl", path, paced.append)
    assert store.get("wheels/ab/wheel.whl") == data
    assert sum(paced) >= len(data)


def test_a_file_put_replaces_an_existing_object(store, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"second")
    store.put("run/f", b"first, longer")
    store.put_file("run/f", path)
    assert store.get("run/f") == b"second"


def test_read_into_a_smaller_buffer_fills_it_and_reports_the_full_size(store):
    store.put("run/o", b"0123456789")
    buffer = bytearray(4)
    assert store.read_into("run/o", memoryview(buffer)) == 10
    assert buffer == b"0123"


def test_an_empty_object_is_an_object(store):
    store.put("run/empty", b"")
    assert store.size("run/empty") == 0 and store.get("run/empty") == b""


@pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/../b", "a\\b", ""])
def test_unsafe_keys_are_refused_before_reaching_the_backend(store, key):
    with pytest.raises(SnapshotError):
        store.put(key, b"x")


def test_a_snapshot_written_into_the_store_loads_back_verified(store):
    tensors = {"w": torch.randn(300_000), "b": torch.arange(5)}
    captured = Captured(3, {k: {"$tensor": k} for k in tensors}, tensors, {"reason": "test"})
    snapshot.write_snapshot(store, "run", captured)
    assert reader.list_steps(store, "run") == [3]
    loaded = load_tensors(store, reader.read_manifest(store, "run"))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


# -- ranged reads (a sharded snapshot's ranks read only their own bytes) --------------


def test_a_range_reads_exactly_the_bytes_it_names(store):
    data = os.urandom(100_000)
    store.put("run/blob", data)
    for start, length in ((0, 100_000), (0, 1), (99_999, 1), (12_345, 54_321), (500, 0),
                          (100_000, 0)):
        assert bytes(store.read_range("run/blob", start, length)) == data[start:start + length]


def test_a_range_of_a_missing_object_is_a_key_error(store):
    with pytest.raises(KeyError):
        store.read_range("run/missing", 0, 10)


def test_a_range_past_the_objects_end_is_a_store_error(store):
    store.put("run/short", b"0123456789")
    with pytest.raises(StoreError):
        store.read_range("run/short", 5, 6)
    with pytest.raises(StoreError):
        store.read_range("run/short", 11, 0)


def test_a_long_s3_range_comes_back_whole_from_parallel_parts(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    s3 = open_store(moto_s3.url(), **moto_s3.options())
    s3.get_part_size = 4096  # a 50 kB range goes in 13 ranged GETs
    data = os.urandom(60_000)
    s3.put("run/blob", data)
    assert bytes(s3.read_range("run/blob", 7, 50_000)) == data[7:50_007]
    with pytest.raises(StoreError):
        s3.read_range("run/blob", 20_000, 40_001)

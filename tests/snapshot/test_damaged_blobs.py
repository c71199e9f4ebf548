"""A blob whose bytes no longer match its name leaves the store once a read finds it, so
the next snapshot of the same bytes writes it again instead of naming the damaged copy
(writers skip a blob the store already holds at its size)."""

from __future__ import annotations

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import damaged, reader
from burst.snapshot import format as fmt
from burst.snapshot.tensors import load_tensors
from burst.store import LocalStore, open_store
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import BUCKET, aws_env
from tests.snapshot.test_snapshot_hash import corrupt_one_blob


def state() -> dict[str, torch.Tensor]:
    return {"big": torch.randn(2_000_000, generator=torch.Generator().manual_seed(0))}


def biggest(manifest: dict) -> str:
    return max(manifest["blobs"], key=lambda d: manifest["blobs"][d]["size"])


def test_a_restore_that_finds_a_damaged_blob_deletes_it(tmp_path):
    store = LocalStore(tmp_path)
    manifest = take(store, 5, state())
    corrupt_one_blob(store, manifest)  # the biggest blob
    with pytest.raises(SnapshotError, match="deleted from"):
        load_tensors(store, reader.read_manifest(store, "run", 5))
    assert store.size(fmt.blob_key("run", biggest(manifest))) is None


def test_the_next_snapshot_of_the_same_bytes_writes_the_deleted_blob_again(tmp_path):
    store = LocalStore(tmp_path)
    manifest = take(store, 5, state())
    corrupt_one_blob(store, manifest)  # the biggest blob
    with pytest.raises(SnapshotError):
        reader.verify(store, "run", 5)
    take(store, 6, state())  # the step replayed after a fallback: the same bytes
    assert reader.verify(store, "run", 6)["step"] == 6
    loaded = load_tensors(store, reader.read_manifest(store, "run", 6))
    assert torch.equal(loaded["big"], state()["big"])


def test_an_intact_blob_is_never_condemned(tmp_path):
    store = LocalStore(tmp_path)
    manifest = take(store, 5, state())
    digest = biggest(manifest)
    assert not damaged.condemn(store, "run", digest, fmt.hash_of(manifest))
    assert store.size(fmt.blob_key("run", digest)) == manifest["blobs"][digest]["size"]


def test_a_blob_damaged_in_an_s3_store_is_deleted_there(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    store = open_store(moto_s3.url("damaged"), **moto_s3.options())
    manifest = take(store, 5, state())
    digest = biggest(manifest)
    key = fmt.blob_key("run", digest)
    data = bytearray(store.get(key))
    data[7] ^= 1
    moto_s3.client().put_object(Bucket=BUCKET, Key=f"damaged/{key}", Body=bytes(data))
    with pytest.raises(SnapshotError, match="deleted from"):
        load_tensors(store, reader.read_manifest(store, "run", 5))
    assert store.size(key) is None

"""``Store.read_range`` on every backend: local, memory, S3 (moto, SeaweedFS over TLS, OSS
dialect) and SFTP on a real OpenSSH server."""

from __future__ import annotations

import os
import uuid

import pytest

from burst.errors import StoreError
from burst.store import open_store
from tests.store_servers import aws_env

BACKENDS = ["local", "memory", "moto", "seaweed", "oss-on-seaweed", "sftp"]


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path, monkeypatch):
    """A fresh, empty store of each backend (a unique prefix on the shared servers)."""
    kind = request.param
    aws_env(monkeypatch)
    if kind == "local":
        return open_store(tmp_path / "store")
    if kind == "memory":
        return open_store(f"memory://{uuid.uuid4().hex}")
    if kind in ("moto", "seaweed", "oss-on-seaweed"):
        server = request.getfixturevalue("moto_s3" if kind == "moto" else "seaweed")
        url = server.url()
        return open_store(url.replace("s3://", "oss://") if kind.startswith("oss") else url,
                          **server.options())
    sshd = request.getfixturevalue("sshd")
    return open_store(sshd.url(), ssh_config=str(sshd.config))


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

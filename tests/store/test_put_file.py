"""Large files into S3 (SeaweedFS over TLS, through the fault proxy where a fault is
needed): multipart from disk, and an interrupted upload continued where it stopped."""

from __future__ import annotations

import os
import re
import threading
import tracemalloc
from pathlib import Path

import pytest

from burst.errors import StoreError
from burst.store import open_store
from burst.store.files import upload_files
from burst.store.retry import RetryPolicy
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.store_servers import aws_env

PART = 5 << 20  # S3's smallest part: a 23 MiB file goes up in 5 parts
PART_PUT = r"[?&]partNumber=(\d+)"
FAST = RetryPolicy(attempts=2, base=0.05, cap=0.1)


@pytest.fixture
def proxy(seaweed_proxy: tuple[FaultProxy, str]) -> tuple[FaultProxy, str]:
    return seaweed_proxy  # tests/helpers/store_servers.py: SeaweedFS behind a fresh fault proxy


def a_file(tmp_path: Path, size: int, name: str = "big.whl") -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def parts_sent(faults: FaultProxy, since: int = 0) -> list[int]:
    """The part numbers of the multipart PUTs that reached the server, in order."""
    out = []
    for method, path, _ranged, _sent in faults.served[since:]:
        found = re.search(PART_PUT, path)
        if method == "PUT" and found:
            out.append(int(found.group(1)))
    return out


def test_a_file_bigger_than_a_part_goes_up_without_being_read_into_memory(seaweed, tmp_path,
                                                                          monkeypatch):
    aws_env(monkeypatch)
    store = open_store(seaweed.url(), **seaweed.options(part_size=PART, workers=2))
    path, data = a_file(tmp_path, 48 << 20)
    tracemalloc.start()
    try:
        store.put_file("wheels/x/big.whl", path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 4, f"the upload held {peak >> 20} MiB of a 48 MiB file"
    assert store.get("wheels/x/big.whl") == data


def test_an_interrupted_file_upload_continues_with_the_parts_it_lacks(proxy, seaweed, tmp_path):
    faults, endpoint = proxy
    url = seaweed.url()
    store = open_store(url, endpoint_url=endpoint, addressing_style="path", part_size=PART)
    path, data = a_file(tmp_path, (4 * PART) + 123)
    faults.add("reset-request", "PUT", r"partNumber=3\b", times=None)  # part 3 never lands
    with pytest.raises(StoreError):
        store.put_file("wheels/y/big.whl", path)
    assert store.size("wheels/y/big.whl") is None  # nothing visible until it is whole
    faults.clear()
    before = len(faults.served)
    store.put_file("wheels/y/big.whl", path)
    assert parts_sent(faults, before) == [3]  # parts 1, 2, 4, 5 were found on the server
    assert open_store(url, **seaweed.options()).get("wheels/y/big.whl") == data  # no proxy


def test_a_stopped_file_upload_keeps_its_parts_for_the_next_call(proxy, seaweed, tmp_path):
    faults, endpoint = proxy
    store = open_store(seaweed.url(), endpoint_url=endpoint, addressing_style="path",
                       part_size=PART, workers=1)
    path, data = a_file(tmp_path, (3 * PART) + 5)
    stop = threading.Event()
    paced = []

    def pace(nbytes: int) -> None:
        paced.append(nbytes)
        if len(paced) == 3:
            stop.set()  # the stager is told to stop as part 3 leaves: part 4 never does

    first = upload_files(store, [("wheels/z/big.whl", path)], pace=pace, stop=stop)
    assert first.stopped and first.sent == 0
    before = len(faults.served)
    second = upload_files(store, [("wheels/z/big.whl", path)])
    assert second.sent == 1 and parts_sent(faults, before) == [4]
    assert store.get("wheels/z/big.whl") == data


def test_files_the_store_has_at_their_size_are_not_sent_again(proxy, seaweed, tmp_path):
    faults, endpoint = proxy
    store = open_store(seaweed.url(), endpoint_url=endpoint, addressing_style="path",
                       part_size=PART)
    files = [(f"wheels/{i}/w{i}.whl", a_file(tmp_path, 1000 + i, f"w{i}.whl")[0])
             for i in range(5)]
    faults.add("503", "PUT", r"/wheels/3/", times=None)
    with pytest.raises(StoreError):
        upload_files(store, files, policy=FAST)
    faults.clear()
    before = len(faults.served)
    again = upload_files(store, files)
    assert (again.sent, again.present) == (1, 4)
    puts = [path for method, path, _r, _s in faults.served[before:] if method == "PUT"]
    assert len(puts) == 1 and "/wheels/3/" in puts[0]


class Gate:
    """A real store whose file puts each wait until ``parties`` are in flight: an upload
    that sent one file after another would never get past the first."""

    def __init__(self, store, parties: int) -> None:
        self.store, self.url = store, store.url
        self.barrier = threading.Barrier(parties, timeout=30)

    def put_file(self, key: str, path: Path, pace=None) -> None:
        self.barrier.wait()
        self.store.put_file(key, path, pace)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_several_files_go_up_at_once(tmp_path):
    from burst.store.files import FILE_WORKERS

    store = open_store(tmp_path / "store")
    files = [(f"wheels/{i}/w.whl", a_file(tmp_path, 100 + i, f"w{i}.whl")[0])
             for i in range(FILE_WORKERS)]
    sent = upload_files(Gate(store, FILE_WORKERS), files)
    assert sent.sent == FILE_WORKERS
    assert all(store.get(key) == path.read_bytes() for key, path in files)

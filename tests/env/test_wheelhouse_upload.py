"""The wheelhouse's upload into S3 (SeaweedFS behind the fault proxy): several wheels at
once, each from disk, and an upload cut in the middle sends only what is missing."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from burst.env import wheelhouse
from burst.errors import StoreError
from burst.store import open_store
from burst.store.retry import RetryPolicy
from tests.helpers.fault_proxy import FaultProxy

PART = 5 << 20
FAST = RetryPolicy(attempts=2, base=0.05, cap=0.1)
DIGEST = "cd" * 32


@pytest.fixture
def proxy(seaweed_proxy: tuple[FaultProxy, str]) -> tuple[FaultProxy, str]:
    return seaweed_proxy  # tests/helpers/store_servers.py: SeaweedFS behind a fresh fault proxy


def synthetic_wheel(root: Path, name: str, size: int) -> wheelhouse.Wheel:
    """A wheel-named file of random bytes: the upload never opens it."""
    path = root / f"{name}-1.0-py3-none-any.whl"
    path.write_bytes(os.urandom(size))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return wheelhouse.Wheel(name, "1.0", path.name, sha, size, "dependency", path)


def test_a_wheelhouse_upload_cut_in_the_middle_sends_only_what_is_missing_the_second_time(
        proxy, seaweed, tmp_path):
    faults, endpoint = proxy
    url = seaweed.url()
    store = open_store(url, endpoint_url=endpoint, addressing_style="path", part_size=PART)
    wheels = [synthetic_wheel(tmp_path, f"small{i}", 2000 + i) for i in range(3)]
    wheels.append(synthetic_wheel(tmp_path, "big", 4 * PART + 99))  # 5 parts
    house = wheelhouse.Wheelhouse(wheelhouse.Target("3.11"), wheels)
    faults.add("reset-request", "PUT", r"/big-1\.0-.*partNumber=3\b", times=None)
    with pytest.raises(StoreError):
        wheelhouse.upload(store, "run", DIGEST, house, policy=FAST)
    assert wheelhouse.load_index(store, "run", DIGEST) is None  # the index comes last
    faults.clear()
    before = len(faults.served)
    done = wheelhouse.upload(store, "run", DIGEST, house, policy=FAST)
    puts = [path for method, path, _range, _sent in faults.served[before:] if method == "PUT"]
    parts = [path for path in puts if re.search(r"partNumber=\d+", path)]
    assert len(parts) == 1 and "partNumber=3" in parts[0]  # the rest of big was there
    assert [p for p in puts if p not in parts] == [f"/{url[5:]}/run/env/wheelhouse-{DIGEST}.json"]
    assert (done.wheels_sent, done.wheels_present) == (1, 3)
    direct = open_store(url, **seaweed.options())  # not through the proxy
    for wheel in wheels:
        assert direct.get(wheel.key) == wheel.path.read_bytes()

"""A node in the bucket's own region reads OSS through the internal endpoint, others through
the public one: ``internal = "auto"`` (what a resumed node is given) tries the internal
endpoint first with a short connect, on loopback here (a listening socket stands for a
node inside the VPC, a closed port for one outside it)."""

from __future__ import annotations

import socket

import pytest

from burst.node import bootstrap
from burst.store import oss
from burst.store.oss import internal_first

PUBLIC = "https://s3.oss-cn-beijing.aliyuncs.com"


@pytest.fixture
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def fresh_probes():
    oss._REACHED.clear()  # each test's ports are new


def test_a_node_that_reaches_the_internal_endpoint_uses_it(listening):
    options = {"region": "oss-cn-beijing", "internal": "auto", "endpoint_url": PUBLIC,
               "internal_endpoint": listening}
    assert internal_first(options) == {"region": "oss-cn-beijing", "endpoint_url": listening}


def test_a_node_outside_the_region_falls_back_to_the_public_endpoint(closed):
    options = {"region": "oss-cn-beijing", "internal": "auto", "endpoint_url": PUBLIC,
               "internal_endpoint": closed}
    assert internal_first(options)["endpoint_url"] == PUBLIC


def test_the_bootstrap_makes_the_same_choice_before_opening_the_store(listening, closed):
    inside = {"BURST_OSS_INTERNAL": "auto", "BURST_ENDPOINT_URL": PUBLIC,
              "BURST_OSS_INTERNAL_ENDPOINT": listening}
    bootstrap.prefer_internal(inside)
    assert (inside["BURST_ENDPOINT_URL"], inside["BURST_OSS_INTERNAL"]) == (listening, "false")
    outside = {**inside, "BURST_OSS_INTERNAL": "auto", "BURST_ENDPOINT_URL": PUBLIC,
               "BURST_OSS_INTERNAL_ENDPOINT": closed}
    bootstrap.prefer_internal(outside)
    assert outside["BURST_ENDPOINT_URL"] == PUBLIC
    source = bootstrap.s3_source("oss://bucket/runs", {**outside, "BURST_REGION": "cn-beijing"})
    assert source.endpoint == PUBLIC


def test_an_explicit_internal_setting_is_left_as_it_is():
    assert internal_first({"internal": "true", "region": "oss-cn-beijing"}) == {
        "internal": "true", "region": "oss-cn-beijing"}

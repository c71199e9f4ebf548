"""``burst resume`` asks S3 where the bucket lives and the task carries that region.

The endpoint is :mod:`tests.helpers.region_proxy` in front of moto: it answers as AWS does, 400
``AuthorizationHeaderMalformed`` naming the bucket's region for a request signed for
another, and HeadBucket's ``x-amz-bucket-region``. This machine's store is configured for
``us-east-1``; the bucket is in ``eu-central-1``.
"""

from __future__ import annotations

import pytest

from burst.launch.task import NodeSoftware
from burst.resume import bucket_region
from burst.resume.handoff import Request, prepare
from burst.store import open_store
from burst.store.s3 import bucket_region as asked_region
from tests.helpers.plan_helpers import GIB, manifest, put_manifest
from tests.helpers.region_proxy import RegionProxy
from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY, aws_env

HOME = "eu-central-1"


@pytest.fixture
def proxy(moto_s3, monkeypatch, tmp_path):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    with RegionProxy(moto_s3.endpoint, None, HOME, {ACCESS_KEY: (SECRET_KEY, None)},
                     (ACCESS_KEY, SECRET_KEY)) as running:
        monkeypatch.setenv("BURST_ENDPOINT_URL", running.endpoint)
        monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
        monkeypatch.setenv("BURST_REGION", "us-east-1")
        yield running


def test_the_bucket_names_its_region_to_a_request_signed_for_another(proxy, moto_s3):
    store = open_store(moto_s3.url())
    assert asked_region(store) == HOME
    assert any(seen.status == 400 and seen.region == "us-east-1" for seen in proxy.seen), \
        "the proxy refused the first guess, as AWS does"


def test_the_task_carries_the_buckets_own_region_with_a_warning(proxy, moto_s3, tmp_path):
    url = moto_s3.url()
    put_manifest(open_store(url), manifest("run", peaks={8: 3 * GIB}, global_batch=64,
                                           micro=8, card="NVIDIA L4", reason="oom"))
    request = Request("run", url, str(tmp_path / "local"), cards=("A100",), dry_run=True,
                      command=("python", "train.py"), private_endpoints=True,
                      software=NodeSoftware("/usr/bin/python3", "burst-failover"))
    prepared = prepare(request, say=lambda _m: None)
    assert f"BURST_REGION: \"{HOME}\"" in prepared.task.yaml, prepared.task.yaml
    assert [w for w in prepared.warnings if f"is in {HOME}, not us-east-1" in w]


def test_an_oss_store_keeps_the_region_its_endpoint_names(monkeypatch, tmp_path):
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("BURST_REGION", "oss-cn-beijing")
    envs = {"BURST_REGION": "oss-cn-beijing"}
    assert bucket_region.forward(open_store("oss://bucket/runs"), envs) == []
    assert envs == {"BURST_REGION": "oss-cn-beijing"}

"""OSS through a custom (CNAME) domain bound to the bucket: requests go to
``<domain>/<key>``, signed for that URL, against a real S3 server behind a loopback proxy
that checks the signature as an OSS custom domain does."""

from __future__ import annotations

import io
import uuid

import pytest

from burst.errors import ConfigError, StoreError
from burst.node import bootstrap
from burst.store import open_store
from burst.store.oss import public_endpoint
from tests.helpers.cname_proxy import CnameProxy
from tests.helpers.store_servers import ACCESS_KEY, BUCKET, SECRET_KEY, aws_env


@pytest.fixture
def cname(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", SECRET_KEY)
    with CnameProxy(moto_s3.endpoint, moto_s3.ca_bundle, BUCKET, ACCESS_KEY, SECRET_KEY,
                    "cn-beijing") as proxy:
        yield proxy


def _store(proxy: CnameProxy, prefix: str, **extra: str):
    return open_store(f"oss://{BUCKET}/{prefix}", endpoint_url=proxy.endpoint,
                      region="oss-cn-beijing", bucket_endpoint="true", part_size=str(5 << 20),
                      **extra)


def test_a_bucket_bound_domain_serves_every_store_operation_at_slash_key(cname, moto_s3):
    prefix = uuid.uuid4().hex[:10]
    store = _store(cname, prefix)
    big = bytes(range(256)) * (6 << 12)  # > part_size: multipart up, ranged reads down
    store.put("a/small", b"hello")
    store.put("a/big", big)
    assert store.put_if_absent("a/manifest", b"{}") is True
    assert store.put_if_absent("a/manifest", b"{}") is False
    assert store.get("a/small") == b"hello"
    buffer = bytearray(len(big))
    assert store.read_into("a/big", memoryview(buffer)) == len(big) and bytes(buffer) == big
    assert sorted(store.list("a/")) == ["a/big", "a/manifest", "a/small"]
    store.delete("a/small")
    assert store.size("a/small") is None
    assert cname.paths and not any(p.startswith(f"/{BUCKET}") for p in cname.paths)
    listed = moto_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/a/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [f"{prefix}/a/big",
                                                            f"{prefix}/a/manifest"]


def test_the_nodes_bootstrap_fetches_through_the_bucket_bound_domain(cname):
    prefix = uuid.uuid4().hex[:10]
    _store(cname, prefix).put("wheels/a.whl", b"wheel bytes")
    environ = {"BURST_ENDPOINT_URL": cname.endpoint, "BURST_REGION": "oss-cn-beijing",
               "BURST_BUCKET_ENDPOINT": "true", "OSS_ACCESS_KEY_ID": ACCESS_KEY,
               "OSS_ACCESS_KEY_SECRET": SECRET_KEY}
    source = bootstrap.s3_source(f"oss://{BUCKET}/{prefix}", environ)
    out = io.BytesIO()
    source.fetch("wheels/a.whl", out)
    assert out.getvalue() == b"wheel bytes"
    assert cname.paths[-1] == f"/{prefix}/wheels/a.whl"


def test_the_domain_refuses_a_request_signed_with_another_key(cname, monkeypatch):
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "not-the-secret")
    with pytest.raises(StoreError, match="SignatureDoesNotMatch"):
        _store(cname, "denied").put("x", b"1")


def test_bucket_endpoint_without_an_endpoint_url_is_a_config_error():
    with pytest.raises(ConfigError, match="bucket_endpoint needs endpoint_url"):
        open_store(f"oss://{BUCKET}/x", region="oss-cn-beijing", bucket_endpoint="true")


def test_an_internal_oss_endpoint_has_a_public_twin():
    assert public_endpoint("https://s3.oss-cn-beijing-internal.aliyuncs.com") == \
        "https://s3.oss-cn-beijing.aliyuncs.com"
    assert public_endpoint("https://s3.oss-cn-beijing.aliyuncs.com") is None
    assert public_endpoint("https://ckpt.example.com") is None

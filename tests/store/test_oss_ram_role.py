"""An ``oss://`` store with ``node_identity = "own"`` and no keys signs with the ECS
instance's RAM role (what ``burst node setup`` and the run do on an ACK or ECS node after
the bootstrap): credentials from a loopback ECS metadata service in hardened mode, the
STS token sent with every request, to an endpoint that refuses anything else."""

from __future__ import annotations

import pytest

from burst.contract import ENV_METADATA_URL
from burst.store import open_store
from burst.store.ramrole import EcsRamRole
from tests.helpers.region_proxy import RegionProxy
from tests.helpers.role_metadata import RoleMetadata
from tests.helpers.store_servers import ACCESS_KEY, BUCKET, SECRET_KEY, aws_env, free_port

ROLE_KEY, ROLE_SECRET, ROLE_TOKEN = "STS.NodeRoleKey", "ram-role-secret", "ram-role-token"


@pytest.fixture
def bucket_domain(moto_s3, monkeypatch, tmp_path):
    """OSS behind a bucket-bound domain on 127.0.0.1 that knows only the role's keys."""
    aws_env(monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "OSS_ACCESS_KEY_ID",
                 "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # AWS's IMDS is nobody here
    with RegionProxy(moto_s3.endpoint, None, "cn-beijing",
                     {ROLE_KEY: (ROLE_SECRET, ROLE_TOKEN)}, (ACCESS_KEY, SECRET_KEY),
                     bound_bucket=BUCKET) as proxy:
        yield proxy


def oss_store(proxy: RegionProxy, **options: object):
    return open_store("oss://burst/ram-role-run", endpoint_url=proxy.endpoint,
                      bucket_endpoint=True, region="oss-cn-beijing", **options)


def test_an_oss_store_of_own_identity_signs_with_the_ecs_ram_role(bucket_domain, monkeypatch):
    with RoleMetadata(ROLE_KEY, ROLE_SECRET, ROLE_TOKEN) as metadata:
        monkeypatch.setenv(ENV_METADATA_URL, metadata.url)
        store = oss_store(bucket_domain, node_identity="own")
        store.put("run/snapshots/1.json", b"{}")
        assert store.get("run/snapshots/1.json") == b"{}"
    assert "PUT /latest/api/token" in metadata.asked
    assert {(s.access_key, s.token, s.status) for s in bucket_domain.seen} == {
        (ROLE_KEY, ROLE_TOKEN, 200)}


def test_without_own_identity_no_metadata_is_asked(bucket_domain, monkeypatch):
    with RoleMetadata(ROLE_KEY, ROLE_SECRET, ROLE_TOKEN) as metadata:
        monkeypatch.setenv(ENV_METADATA_URL, metadata.url)
        store = oss_store(bucket_domain)
        with pytest.raises(Exception, match="credentials"):
            store.put("run/x", b"x")
    assert metadata.asked == []


def test_where_no_ecs_metadata_answers_the_provider_steps_aside():
    dead = {ENV_METADATA_URL: f"http://127.0.0.1:{free_port()}"}
    assert EcsRamRole(dead).load() is None  # boto3's own chain goes on

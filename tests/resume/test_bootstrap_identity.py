"""The node bootstrap against an S3 endpoint that behaves as AWS does: a bucket in its own
region (a request signed for another is answered 400 naming the right one) and a bucket
that refuses anonymous reads, read with the node's own role credentials from a metadata
service (AWS IMDSv2, Alibaba's ECS RAM role) or a web-identity token through STS.

The bucket is SeaweedFS's (it checks every signature and refuses anonymous reads);
:mod:`tests.helpers.region_proxy` stands in front of it as AWS's region and IAM checks, and
:mod:`tests.helpers.role_metadata` is the metadata service and STS, all on 127.0.0.1. The
bootstrap runs as the task runs it (a copy, the system python, a clean environment).
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from burst.contract import ENV_METADATA_URL
from burst.node import bootstrap
from burst.store.settings import OPTIONS
from tests.helpers.region_proxy import RegionProxy
from tests.helpers.role_metadata import ROLE_ARN, WEB_TOKEN, RoleMetadata
from tests.helpers.store_servers import ACCESS_KEY, BUCKET, SECRET_KEY, aws_env, free_port
from tests.resume.test_bootstrap import (
    assert_installed,
    build_wheel,
    one_line,
    publish,
    run_bootstrap,
    seaweed_env,
)

ROLE_KEY, ROLE_SECRET, ROLE_TOKEN = "ASIAROLEKEYFORNODE", "role-secret", "role-session-token"


@pytest.fixture(scope="module")
def node_wheels(tmp_path_factory) -> list[tuple[Path, str]]:
    """(wheel, role): burst's stand-in (a ``burst`` script printing 42) and its dependency."""
    root = tmp_path_factory.mktemp("node_wheels")
    dep = build_wheel(root, "tinydep", "tinydep", "VALUE = 42\n")
    burst = build_wheel(root, "burst-failover", "fakeburst",
                        "import tinydep\n\ndef main():\n    print('burst', tinydep.VALUE)\n",
                        deps=["tinydep"], scripts={"burst": "fakeburst:main"})
    return [(burst, "burst"), (dep, "dependency")]


@pytest.fixture
def store_url(seaweed, monkeypatch) -> str:
    """A fresh prefix of SeaweedFS's bucket; this process reaches it directly."""
    aws_env(monkeypatch)
    for name, value in seaweed_env(seaweed).items():
        monkeypatch.setenv(name, value)
    return seaweed.url()


def proxy_for(seaweed, region: str, **options) -> RegionProxy:
    return RegionProxy(seaweed.endpoint, seaweed.ca_bundle, region,
                       {ACCESS_KEY: (SECRET_KEY, None), ROLE_KEY: (ROLE_SECRET, ROLE_TOKEN)},
                       (ACCESS_KEY, SECRET_KEY), **options)


def through(proxy: RegionProxy, region: str, **extra: str) -> dict[str, str]:
    """The node's environment: the store's endpoint is the proxy, signed for ``region``."""
    return {"BURST_ENDPOINT_URL": proxy.endpoint, "BURST_ADDRESSING_STYLE": "path",
            "BURST_REGION": region, **extra}


def own(metadata: RoleMetadata, **extra: str) -> dict[str, str]:
    return {"BURST_NODE_IDENTITY": "own", "BURST_METADATA_URL": metadata.url, **extra}


def role() -> RoleMetadata:
    return RoleMetadata(ROLE_KEY, ROLE_SECRET, ROLE_TOKEN)


def unsigned_get(url: str, ca_bundle: str | None) -> int:
    context = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else None
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_bootstraps_names_are_the_ones_burst_forwards():
    assert OPTIONS["node_identity"] == bootstrap.IDENTITY_ENV
    assert ENV_METADATA_URL == bootstrap.METADATA_URL_ENV


# -- the bucket's region ----------------------------------------------------------------------


def test_a_bucket_in_another_region_is_read_after_s3_names_it(tmp_path, node_wheels, seaweed,
                                                              store_url):
    publish(store_url, node_wheels)
    with proxy_for(seaweed, "eu-central-1") as proxy:
        done = run_bootstrap(tmp_path, store_url, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                             AWS_SECRET_ACCESS_KEY=SECRET_KEY, **through(proxy, "us-east-1"))
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)
    assert "is in eu-central-1, not us-east-1" in done.stderr
    refused = [s for s in proxy.seen if s.status == 400]
    assert [s.region for s in refused] == ["us-east-1"], "one wrong guess, then no other"
    assert {s.region for s in proxy.seen if s.status == 200} == {"eu-central-1"}


def test_a_bucket_signed_for_its_region_is_never_refused(tmp_path, node_wheels, seaweed,
                                                         store_url):
    publish(store_url, node_wheels)
    with proxy_for(seaweed, "eu-central-1") as proxy:
        done = run_bootstrap(tmp_path, store_url, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                             AWS_SECRET_ACCESS_KEY=SECRET_KEY, **through(proxy, "eu-central-1"))
    assert done.returncode == 0, done.stderr
    assert {s.status for s in proxy.seen} == {200}


@pytest.mark.parametrize(("status", "headers", "body", "named"), [
    (400, {}, "<Error><Code>AuthorizationHeaderMalformed</Code><Region>ap-south-1</Region>"
              "</Error>", "ap-south-1"),
    (400, {"x-amz-bucket-region": "eu-west-2"}, "<Error><Code>AuthorizationHeaderMalformed"
                                                "</Code></Error>", "eu-west-2"),
    (301, {"x-amz-bucket-region": "us-west-2"}, "", "us-west-2"),
    (301, {}, "<Error><Code>PermanentRedirect</Code><Region>cn-north-1</Region></Error>",
     "cn-north-1"),
    (400, {"x-amz-bucket-region": "eu-west-2"}, "<Error><Code>InvalidArgument</Code></Error>",
     None),
    (403, {"x-amz-bucket-region": "eu-west-2"}, "<Error><Code>AccessDenied</Code></Error>",
     None),
    (400, {}, "<Error><Code>AuthorizationHeaderMalformed</Code><Region>x</Region></Error>",
     None),
])
def test_the_region_an_error_names(status, headers, body, named):
    assert bootstrap.region_named(status, headers, body) == named


def test_an_aws_endpoint_moves_with_the_region_it_was_derived_from():
    source = bootstrap.s3_source("s3://bucket/runs", {"BURST_REGION": "us-east-1"})
    assert source.move_to("eu-west-1", "us-east-1")
    assert source.endpoint == "https://s3.eu-west-1.amazonaws.com"
    assert not source.move_to("ap-south-1", "eu-west-1"), "a second move is an error"


# -- the node's own identity ------------------------------------------------------------------


def test_the_bucket_refuses_anonymous_reads(seaweed, store_url):
    key = f"{store_url.split('/', 3)[3]}/anything"
    with proxy_for(seaweed, "us-east-1") as proxy:
        assert unsigned_get(f"{proxy.endpoint}/{BUCKET}/{key}", None) == 403
    assert unsigned_get(f"{seaweed.endpoint}/{BUCKET}/{key}", seaweed.ca_bundle) == 403


def test_own_identity_signs_with_the_aws_instance_roles_credentials(tmp_path, node_wheels,
                                                                     seaweed, store_url):
    publish(store_url, node_wheels)
    with proxy_for(seaweed, "us-west-2") as proxy, role() as metadata:
        done = run_bootstrap(tmp_path, store_url, **through(proxy, "us-west-2"), **own(metadata))
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)
    assert metadata.asked[:3] == [
        "PUT /latest/api/token", "GET /latest/meta-data/iam/security-credentials/",
        f"GET /latest/meta-data/iam/security-credentials/{'burst-node-role'}"]
    assert {(s.access_key, s.token, s.status) for s in proxy.seen} == {
        (ROLE_KEY, ROLE_TOKEN, 200)}
    assert ROLE_SECRET not in done.stderr and ROLE_TOKEN not in done.stderr


def test_own_identity_signs_with_the_alibaba_ecs_ram_roles_credentials(tmp_path, node_wheels,
                                                                        seaweed, store_url):
    publish(store_url, node_wheels)
    bucket_root = "/" + store_url.split("/", 3)[3]  # oss://burst/<prefix> on a bound domain
    with proxy_for(seaweed, "cn-beijing", bound_bucket=BUCKET) as proxy, role() as metadata:
        env = {"BURST_ENDPOINT_URL": proxy.endpoint, "BURST_BUCKET_ENDPOINT": "true",
               "BURST_REGION": "oss-cn-beijing", **own(metadata)}
        done = run_bootstrap(tmp_path, store_url.replace("s3://", "oss://"), **env)
    assert done.returncode == 0, done.stderr
    assert_installed(tmp_path)
    assert "GET /latest/meta-data/ram/security-credentials/burst-node-role" in metadata.asked
    assert all(s.path.startswith(bucket_root) for s in proxy.seen)
    assert {(s.access_key, s.token, s.region) for s in proxy.seen} == {
        (ROLE_KEY, ROLE_TOKEN, "cn-beijing")}


def test_own_identity_assumes_the_web_identity_role_through_sts(tmp_path, node_wheels, seaweed,
                                                                store_url):
    publish(store_url, node_wheels)
    token = tmp_path / "web-identity-token"
    token.write_text(WEB_TOKEN + "\n")
    with proxy_for(seaweed, "us-east-1") as proxy, role() as metadata:
        env = {**through(proxy, "us-east-1"), "BURST_NODE_IDENTITY": "own",
               "AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_ROLE_ARN": ROLE_ARN,
               "AWS_ENDPOINT_URL_STS": metadata.url}
        done = run_bootstrap(tmp_path, store_url, **env)
    assert done.returncode == 0, done.stderr
    assert metadata.asked == ["POST /"]
    assert {(s.access_key, s.token) for s in proxy.seen} == {(ROLE_KEY, ROLE_TOKEN)}


def test_own_identity_without_a_metadata_service_is_one_line(tmp_path, store_url):
    dead = f"http://127.0.0.1:{free_port()}"
    done = run_bootstrap(tmp_path, store_url, BURST_NODE_IDENTITY="own",
                         BURST_METADATA_URL=dead, BURST_ENDPOINT_URL=dead)
    assert done.returncode == 2
    line = one_line(done)
    assert 'node_identity is "own"' in line and "did not answer" in line, line


def test_own_identity_keeps_keys_the_node_was_given(tmp_path: Path, node_wheels, seaweed,
                                                    store_url):
    publish(store_url, node_wheels)
    dead = f"http://127.0.0.1:{free_port()}"
    with proxy_for(seaweed, "us-east-1") as proxy:
        done = run_bootstrap(tmp_path, store_url, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                             AWS_SECRET_ACCESS_KEY=SECRET_KEY, BURST_NODE_IDENTITY="own",
                             BURST_METADATA_URL=dead, **through(proxy, "us-east-1"))
    assert done.returncode == 0, done.stderr
    assert {s.access_key for s in proxy.seen} == {ACCESS_KEY}

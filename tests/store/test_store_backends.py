"""Backend specifics: configuration, third-party S3 checksums, OSS, SFTP host keys, GCS."""

from __future__ import annotations

import os
import sys

import pytest
from botocore.exceptions import ClientError

from burst.errors import ConfigError, StoreError
from burst.store import open_store
from burst.store.oss import endpoint_for
from burst.store.s3 import S3Store
from burst.store.settings import resolve
from burst.store.sftp import SFTPStore
from tests.helpers.store_servers import BUCKET, aws_env


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setenv("BURST_CONFIG", str(path))
    for name in ("BURST_ENDPOINT_URL", "BURST_REGION"):
        monkeypatch.delenv(name, raising=False)
    return path


def _headers(request) -> dict[str, str]:
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}


# -- configuration ----------------------------------------------------------------------


def test_a_named_store_in_the_config_file_stands_for_its_url_and_settings(config_file):
    config_file.write_text('[stores.lab]\nurl = "s3://ckpt/runs"\n'
                           'endpoint_url = "https://minio.lab:9000"\n')
    assert resolve("lab") == ("s3://ckpt/runs", {"endpoint_url": "https://minio.lab:9000"})


def test_a_url_under_a_configured_store_picks_up_its_settings(config_file):
    config_file.write_text('[stores.cn]\nurl = "oss://bkt"\nregion = "oss-cn-beijing"\n')
    assert resolve("oss://bkt/team/a")[1] == {"region": "oss-cn-beijing"}
    assert resolve("oss://bkt2/x")[1] == {}


def test_flags_beat_the_environment_which_beats_the_config_file(config_file, monkeypatch):
    config_file.write_text('[stores.s]\nurl = "s3://b"\nregion = "from-file"\n'
                           'endpoint_url = "https://file"\n')
    monkeypatch.setenv("BURST_REGION", "from-env")
    _url, options = resolve("s", {"endpoint_url": "https://flag"})
    assert options == {"region": "from-env", "endpoint_url": "https://flag"}


def test_a_config_file_holding_a_secret_is_refused(config_file):
    config_file.write_text('[stores.s]\nurl = "s3://b"\naws_secret_access_key = "x"\n')
    with pytest.raises(ConfigError, match="keep credentials where"):
        resolve("s")


def test_an_unknown_setting_is_refused_by_name(config_file):
    config_file.write_text('[stores.s]\nurl = "s3://b"\nendpont_url = "typo"\n')
    with pytest.raises(ConfigError, match="endpont_url"):
        resolve("s")


# -- S3-compatible services -------------------------------------------------------------


def test_third_party_endpoints_compute_checksums_only_when_required(monkeypatch):
    aws_env(monkeypatch)
    custom = open_store("s3://bkt/p", endpoint_url="https://cos.example.com")
    aws = open_store("s3://bkt/p")
    assert custom.client.meta.config.request_checksum_calculation == "when_required"
    assert custom.client.meta.config.response_checksum_validation == "when_required"
    assert aws.client.meta.config.request_checksum_calculation == "when_supported"


def test_boto3_defaults_are_rejected_by_a_strict_server_over_tls(rclone_s3, monkeypatch):
    """The failure burst's setting avoids: aws-chunked uploads → MissingContentLength."""
    aws_env(monkeypatch)
    client = rclone_s3.client(request_checksum_calculation="when_supported")
    with pytest.raises(ClientError, match="MissingContentLength"):
        client.put_object(Bucket=BUCKET, Key="x", Body=b"hello" * 100)


def test_burst_writes_to_a_strict_server_over_tls_byte_for_byte(rclone_s3, monkeypatch):
    aws_env(monkeypatch)
    store = open_store(rclone_s3.url(), **rclone_s3.options())
    data = os.urandom(70_000)
    store.put("run/blob", data)
    assert store.get("run/blob") == data  # no aws-chunked framing stored inside
    raw = rclone_s3.client(request_checksum_calculation="when_required")
    key = f"{store.prefix}run/blob"
    assert raw.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data


def test_the_manifest_write_is_conditional_on_a_server_that_honours_it(seaweed, monkeypatch):
    aws_env(monkeypatch)
    store = open_store(seaweed.url(), **seaweed.options())
    sent: list[dict] = []
    store.client.meta.events.register("before-send.s3.PutObject",
                                      lambda request, **_: sent.append(_headers(request)))
    assert store.put_if_absent("run/snapshots/1.json", b"a")
    assert sent and sent[-1].get("If-None-Match") == "*"
    # and the server itself refuses an overwrite, even without burst's own check first:
    with pytest.raises(ClientError, match="PreconditionFailed"):
        store.client.put_object(Bucket=BUCKET, Key=f"{store.prefix}run/snapshots/1.json",
                                Body=b"b", IfNoneMatch="*")


def test_a_custom_endpoint_is_where_requests_go(seaweed, monkeypatch):
    """boto3's CRT transfer client would drop endpoint_url; burst's transfers keep it."""
    aws_env(monkeypatch)
    store = open_store(seaweed.url(), **seaweed.options(part_size=5 << 20))
    hosts: list[str] = []
    store.client.meta.events.register("before-send.s3.*",
                                      lambda request, **_: hosts.append(request.url))
    store.put("run/big", os.urandom(11 << 20))  # multipart
    store.read_into("run/big", memoryview(bytearray(11 << 20)))  # ranged GETs
    assert hosts and all(url.startswith(seaweed.endpoint) for url in hosts)


# -- OSS --------------------------------------------------------------------------------


@pytest.mark.parametrize("region", ["oss-cn-beijing", "cn-beijing"])
def test_an_oss_region_maps_to_its_s3_compatible_endpoint(region):
    assert endpoint_for(region) == ("https://s3.oss-cn-beijing.aliyuncs.com", "cn-beijing")
    assert endpoint_for(region, internal=True)[0] == \
        "https://s3.oss-cn-beijing-internal.aliyuncs.com"


def test_oss_uses_virtual_hosted_addressing_and_its_own_credentials(monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "oss-id")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "oss-secret")
    store = open_store("oss://bkt/runs", region="oss-cn-beijing")
    assert store.client.meta.endpoint_url == "https://s3.oss-cn-beijing.aliyuncs.com"
    assert store.client.meta.config.s3["addressing_style"] == "virtual"
    assert store.client.meta.region_name == "cn-beijing"
    assert store.client._request_signer._credentials.access_key == "oss-id"
    assert store.client.meta.config.request_checksum_calculation == "when_required"


def test_oss_sends_forbid_overwrite_instead_of_if_none_match(seaweed, monkeypatch):
    aws_env(monkeypatch)
    store = open_store(seaweed.url().replace("s3://", "oss://"), **seaweed.options())
    sent: list[dict] = []
    store.client.meta.events.register("before-send.s3.PutObject",
                                      lambda request, **_: sent.append(_headers(request)))
    assert store.put_if_absent("run/snapshots/1.json", b"a")
    assert sent[-1].get("x-oss-forbid-overwrite") == "true"
    assert "If-None-Match" not in sent[-1]


def test_oss_without_a_region_says_how_to_give_one(monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.delenv("OSS_REGION", raising=False)
    with pytest.raises(ConfigError, match="oss-cn-beijing"):
        open_store("oss://bkt/x")


# -- SFTP -------------------------------------------------------------------------------


def test_sftp_is_fsspecs_own_backend_even_with_sshfs_installed(sshd):
    from fsspec.implementations.sftp import SFTPFileSystem

    store = open_store(sshd.url(), ssh_config=str(sshd.config))
    store.put("run/x", b"1")
    connection = store.sessions.filesystem()
    assert isinstance(connection, SFTPFileSystem)
    assert "sshfs" not in type(connection).__module__


def test_sftp_reads_host_user_port_and_key_from_the_users_ssh_config(sshd, tmp_path,
                                                                     monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd.config.read_text())
    monkeypatch.setenv("HOME", str(home))
    store = open_store(sshd.url())
    assert (store.host, store.kwargs["port"]) == ("127.0.0.1", sshd.port)
    store.put("run/y", b"2")
    assert store.get("run/y") == b"2"


def test_sftp_refuses_a_host_whose_key_is_not_known(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts either
    config = tmp_path / "ssh_config"
    config.write_text(sshd.config.read_text().replace(str(sshd.known_hosts),
                                                      str(tmp_path / "empty")))
    store = open_store(sshd.url(), ssh_config=str(config))
    with pytest.raises(StoreError, match="not in known_hosts") as err:
        store.put("run/x", b"1")
    assert "\n" not in str(err.value)


def test_sftp_refuses_a_host_whose_key_changed(sshd, tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("HOME", str(tmp_path))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    impostor = " ".join((tmp_path / "k.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {impostor}\n")
    store = open_store(sshd.url(), ssh_config=str(sshd.config), known_hosts=str(known))
    with pytest.raises(StoreError, match="CHANGED"):
        store.put("run/x", b"1")


def test_an_sftp_url_with_a_password_is_refused():
    with pytest.raises(ConfigError, match="password"):
        SFTPStore("sftp://u:secret@host/data", {})


# -- GCS --------------------------------------------------------------------------------


def test_gs_without_gcsfs_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    with pytest.raises(ConfigError, match=r"burst-failover\[gcs\]"):
        open_store("gs://bucket/runs")


@pytest.mark.filterwarnings("ignore:GCS project not set")
def test_gs_urls_are_parsed_into_bucket_and_prefix(monkeypatch):
    pytest.importorskip("gcsfs")
    store = open_store("gs://bucket/team/runs", endpoint_url="http://127.0.0.1:9")
    assert (store.bucket, store.prefix) == ("bucket", "team/runs/")


def test_s3_store_keys_live_under_the_url_prefix(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    store = open_store(moto_s3.url("pfx"), **moto_s3.options())
    assert isinstance(store, S3Store)
    store.put("run/k", b"v")
    raw = moto_s3.client(**{}).list_objects_v2(Bucket=BUCKET, Prefix="pfx/")
    assert [o["Key"] for o in raw["Contents"]] == ["pfx/run/k"]



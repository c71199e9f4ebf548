"""Credentials that last, and nothing sent to a node that only holds on this machine.

Temporary keys (a session token) expire mid-run: the node's uploads then fail and the next
resume starts from an old snapshot, so ``burst resume`` refuses them in one line unless
told otherwise. Local paths and an OSS internal endpoint never reach the task as if they
applied on the node."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.errors import ConfigError
from burst.launch.task import NodeSoftware
from burst.resume.handoff import Request, prepare, secret_values, task_envs
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest

KEYS = {"AWS_ACCESS_KEY_ID": "AKIAKEYTHATLASTS0001", "AWS_SECRET_ACCESS_KEY": "long-lived-secret"}


@pytest.fixture
def s3_keys(monkeypatch, tmp_path):
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "OSS_SESSION_TOKEN", "AWS_PROFILE", "BURST_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))


def test_a_session_token_is_refused_in_one_line(s3_keys, monkeypatch, moto_s3):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "sts-token-that-expires")
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    result = CliRunner().invoke(main, ["resume", "run", "--store", moto_s3.url(), "--offline",
                                       "--to", "skypilot", "--", "python", "train.py"])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "temporary" in lines[0] and "AWS_SESSION_TOKEN" in lines[0]
    assert "sts-token-that-expires" not in result.output


def test_an_allowed_session_token_travels_with_a_one_line_warning(s3_keys, monkeypatch):
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "oss-key")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "oss-secret")
    monkeypatch.setenv("OSS_SESSION_TOKEN", "oss-sts-token")
    request = Request("r", "oss://bucket/runs", "local", temporary_credentials=True)
    values, warnings = secret_values(request)
    assert values["OSS_SESSION_TOKEN"] == "oss-sts-token"
    assert [w for w in warnings if "temporary" in w and "\n" not in w]
    with pytest.raises(ConfigError, match="OSS_SESSION_TOKEN"):
        secret_values(Request("r", "oss://bucket/runs", "local"))


def test_the_nodes_own_identity_forwards_no_keys(s3_keys, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "sts-token-that-expires")
    monkeypatch.setenv("BURST_NODE_IDENTITY", "own")
    values, warnings = secret_values(Request("r", "s3://bucket/runs", "local"))
    assert values == {} and warnings == []
    monkeypatch.setenv("BURST_NODE_IDENTITY", "mine")
    with pytest.raises(ConfigError, match="node_identity"):
        secret_values(Request("r", "s3://bucket/runs", "local"))


def test_local_paths_never_appear_in_the_task(s3_keys, monkeypatch, moto_s3, tmp_path):
    here = tmp_path / "this-machine-only"
    here.mkdir()
    (here / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    for name, env in (("ca.pem", "BURST_CA_BUNDLE"), ("known_hosts", "BURST_KNOWN_HOSTS"),
                      ("id_ed25519", "BURST_SSH_IDENTITY"), ("ssh_config", "BURST_SSH_CONFIG")):
        monkeypatch.setenv(env, str(here / name))
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    url = moto_s3.url()
    put_manifest(open_store(url), manifest("run", peaks={8: 3 * GIB}, global_batch=64,
                                           micro=8, card="NVIDIA L4", reason="oom"))
    request = Request("run", url, str(tmp_path / "local"), cards=("A100",), dry_run=True,
                      command=("python", "train.py"),
                      software=NodeSoftware("/usr/bin/python3", "burst-failover"))
    prepared = prepare(request, say=lambda _m: None)
    assert "this-machine-only" not in prepared.task.yaml
    assert "BEGIN CERTIFICATE" in prepared.task.yaml  # the CA travels as text
    assert any("known_hosts" in w for w in prepared.warnings)


def test_an_oss_node_tries_the_internal_endpoint_first_and_the_public_one_after(s3_keys,
                                                                                 monkeypatch):
    monkeypatch.setenv("BURST_REGION", "oss-cn-beijing")
    monkeypatch.setenv("BURST_OSS_INTERNAL", "true")
    envs = task_envs(Request("r", "oss://bucket/runs", "local"))
    assert envs["BURST_OSS_INTERNAL"] == "auto" and envs["BURST_REGION"] == "oss-cn-beijing"
    assert "BURST_ENDPOINT_URL" not in envs  # the node derives both from the region
    monkeypatch.setenv("BURST_ENDPOINT_URL", "https://s3.oss-cn-beijing-internal.aliyuncs.com")
    warnings: list[str] = []
    envs = task_envs(Request("r", "oss://bucket/runs", "local"), warnings=warnings)
    assert envs["BURST_ENDPOINT_URL"] == "https://s3.oss-cn-beijing.aliyuncs.com"
    assert envs["BURST_OSS_INTERNAL_ENDPOINT"] == "https://s3.oss-cn-beijing-internal.aliyuncs.com"
    assert any("a node inside its region's VPC uses it" in w for w in warnings)


def test_an_oss_store_told_internal_false_forwards_no_internal_try(s3_keys, monkeypatch):
    monkeypatch.setenv("BURST_REGION", "oss-cn-beijing")
    monkeypatch.setenv("BURST_OSS_INTERNAL", "false")
    assert "BURST_OSS_INTERNAL" not in task_envs(Request("r", "oss://bucket/runs", "local"))

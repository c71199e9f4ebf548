"""The credentials row: temporary keys that expire before the run's expected end fail,
an unknown expiry warns, long-lived keys pass (botocore reads the real environment)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from burst.preflight.credentials import EXPIRY_ENV, credentials_row
from burst.preflight.table import FAIL, OK, SKIP, WARN
from tests.helpers.store_servers import aws_env

UTC = timezone.utc
HORIZON = timedelta(hours=10)


@pytest.fixture
def session_keys(monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-session-token")


def _in(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat(timespec="seconds")


def test_a_session_token_expiring_before_the_run_ends_fails(session_keys, monkeypatch):
    monkeypatch.setenv(EXPIRY_ENV, _in(2))
    row = credentials_row("s3://b/p", {}, HORIZON, "10 h left")
    assert row.status == FAIL and "before the run's expected end" in row.detail
    assert "long-lived" in row.fix


def test_a_session_token_outlasting_the_run_passes(session_keys, monkeypatch):
    monkeypatch.setenv(EXPIRY_ENV, _in(30))
    assert credentials_row("s3://b/p", {}, HORIZON, "10 h left").status == OK


def test_a_session_token_of_unknown_expiry_warns(session_keys, monkeypatch):
    monkeypatch.delenv(EXPIRY_ENV, raising=False)
    row = credentials_row("s3://b/p", {}, HORIZON, "10 h left")
    assert row.status == WARN and "unknown expiry" in row.detail


def test_long_lived_keys_pass_and_a_file_store_has_none(monkeypatch):
    aws_env(monkeypatch)
    assert credentials_row("s3://b/p", {}, HORIZON, "").status == OK
    assert credentials_row("file:///tmp/x", {}, HORIZON, "").status == SKIP

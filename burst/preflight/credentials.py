"""Will the store's credentials outlive the run?

Temporary credentials (a session token: SSO, an assumed role, STS) expire, and a node that
got a copy of them stops uploading snapshots when they do: the next resume then starts
from an old one. The expiry is known when the environment says it
(``AWS_CREDENTIAL_EXPIRATION``, as the AWS CLI's ``export-credentials`` writes it) or when
botocore holds refreshable credentials (asked through ``refresh_needed``, its public test
for "expires within N seconds"); otherwise the row warns. Long-lived keys pass. Nothing
here contacts a server: credentials that would need one to be fetched (an SSO or
assumed-role profile not yet resolved) are reported as temporary with an unknown expiry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlparse

from burst.preflight.table import FAIL, OK, SKIP, WARN, Row

UTC = timezone.utc  # datetime.UTC is Python 3.11+
NAME = "credentials"
EXPIRY_ENV = "AWS_CREDENTIAL_EXPIRATION"
# botocore's credential sources that are read from files or the environment, no server
STATIC_METHODS = ("env", "shared-credentials-file", "config-file", "explicit",
                  "boto-config", "custom-process")
FIX = ("use long-lived keys scoped to the store, or node_identity = \"own\" for a node "
       "with its own role; or renew the session so it lasts past the run's end")


def credentials_row(url: str, options: Mapping[str, Any], horizon: timedelta,
                    horizon_note: str, now: datetime | None = None) -> Row:
    """The row for a store at ``url`` (resolved) that must stay writable for ``horizon``
    (the run's expected remaining time, explained by ``horizon_note``)."""
    now = now or datetime.now(UTC)
    scheme = urlparse(url).scheme.lower()
    if scheme == "s3":
        return _aws(options, horizon, horizon_note, now)
    if scheme == "oss":
        if os.environ.get("OSS_SESSION_TOKEN"):
            return Row(NAME, WARN, "temporary OSS credentials ($OSS_SESSION_TOKEN) with an "
                       "unknown expiry", FIX)
        return Row(NAME, OK, "long-lived OSS keys" if os.environ.get("OSS_ACCESS_KEY_ID")
                   else "no OSS keys in the environment (the store rows say whether access "
                   "works)")
    return Row(NAME, SKIP, f"{scheme or 'file'}:// stores have no expiring keys")


def _aws(options: Mapping[str, Any], horizon: timedelta, note: str, now: datetime) -> Row:
    import boto3
    from botocore.credentials import RefreshableCredentials
    from botocore.exceptions import BotoCoreError

    try:
        credentials = boto3.session.Session(
            profile_name=options.get("profile")).get_credentials()
    except BotoCoreError as error:
        return Row(NAME, FAIL, f"cannot read the AWS credentials: {error}",
                   "check the profile and ~/.aws/config")
    if credentials is None:
        return Row(NAME, WARN, "no AWS credentials found here (anonymous access?)",
                   "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --profile")
    method = str(getattr(credentials, "method", "") or "unknown")
    if method not in STATIC_METHODS:
        return Row(NAME, WARN, f"temporary credentials from {method}: their expiry is not "
                   "known without asking a server", FIX)
    try:  # refreshable credentials re-read their source here (env or files, no server)
        token = credentials.get_frozen_credentials().token
    except Exception as error:  # botocore refuses credentials that expired already
        return Row(NAME, FAIL, f"the credentials cannot be used: {error}", FIX)
    if not token:
        return Row(NAME, OK, f"long-lived keys ({method}): they do not expire")
    expiry = _expiry_from_env()
    if expiry is not None:
        left = expiry - now
        if left < horizon:
            return Row(NAME, FAIL, f"the session token expires at {expiry.isoformat()}, in "
                       f"{_span(left)}, before the run's expected end ({note})", FIX)
        return Row(NAME, OK, f"the session token expires at {expiry.isoformat()}, after the "
                   f"run's expected end ({note})")
    if isinstance(credentials, RefreshableCredentials):
        if credentials.refresh_needed(refresh_in=int(horizon.total_seconds())):
            return Row(NAME, FAIL, f"the session token expires before the run's expected end "
                       f"({note})", FIX)
        return Row(NAME, OK, f"the session token lasts past the run's expected end ({note})")
    return Row(NAME, WARN, f"temporary credentials (a session token, from {method}) with an "
               f"unknown expiry: set ${EXPIRY_ENV}, or expect them to end mid-run", FIX)


def _expiry_from_env() -> datetime | None:
    text = os.environ.get(EXPIRY_ENV, "").strip()
    if not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds <= 0:
        return "no time (already expired)"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m"

"""Alibaba Cloud OSS through its S3-compatible API: ``oss://bucket/prefix`` plus a region.

A region such as ``oss-cn-beijing`` (or ``cn-beijing``) maps to the S3-compatible endpoint
``https://s3.oss-cn-beijing.aliyuncs.com`` (``-internal`` from inside Alibaba Cloud), which
only accepts virtual-hosted addressing. OSS refuses S3's ``If-None-Match`` on PUT and has
its own ``x-oss-forbid-overwrite: true`` (answering 409 ``FileAlreadyExists``), so the
conditional manifest write is translated on the wire. Credentials come from the variables
Alibaba's own SDKs read (``OSS_ACCESS_KEY_ID``, ``OSS_ACCESS_KEY_SECRET``,
``OSS_SESSION_TOKEN``), else from the usual AWS chain, which with ``node_identity = "own"``
also asks the ECS instance's RAM role (:mod:`burst.store.ramrole`); they are only ever
held in memory.

New Alibaba accounts must reach mainland buckets through a custom domain (a CNAME bound to
the bucket) for data operations. ``endpoint_url = "https://ckpt.example.com"`` with
``bucket_endpoint = true`` sends every request to ``https://ckpt.example.com/<key>``; the
region still names the signing region.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any
from urllib.parse import urlparse, urlunparse

from burst.errors import ConfigError
from burst.store.ramrole import own_identity_session
from burst.store.s3 import (
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    S3Store,
    make_client,
    parse_bucket_url,
)
from burst.store.settings import as_bool, as_int

_REGION = re.compile(r"^(oss-)?([a-z]{2}-[a-z0-9-]+)$")


def endpoint_for(region: str, internal: bool = False) -> tuple[str, str]:
    """(endpoint URL, signing region) for an OSS region id like ``oss-cn-beijing``."""
    match = _REGION.match(region.strip().lower())
    if not match:
        raise ConfigError(f"{region!r} is not an OSS region (like oss-cn-beijing)")
    name = match.group(2)
    suffix = "-internal" if internal else ""
    return f"https://s3.oss-{name}{suffix}.aliyuncs.com", name


_INTERNAL_HOST = re.compile(r"^(.*\boss-[a-z]{2}-[a-z0-9-]+?)-internal(\.aliyuncs\.com)$")


def public_endpoint(endpoint: str) -> str | None:
    """The public twin of an OSS ``-internal`` endpoint (reachable only inside the region's
    VPC), or None when ``endpoint`` is not one."""
    parsed = urlparse(endpoint)
    match = _INTERNAL_HOST.match((parsed.hostname or "").lower())
    if not match:
        return None
    port = f":{parsed.port}" if parsed.port else ""
    return urlunparse((parsed.scheme, f"{match.group(1)}{match.group(2)}{port}", parsed.path,
                       parsed.params, parsed.query, parsed.fragment))


PROBE_SECONDS = 2.0  # a node outside the region's VPC never connects: it times out
_REACHED: dict[tuple[str, int], bool] = {}


def reachable(endpoint: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether a TCP connection to ``endpoint``'s host and port opens (tried once per
    process: an internal endpoint outside its VPC costs the timeout only once)."""
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    where = (parsed.hostname or "", port)
    if where not in _REACHED:
        try:
            with socket.create_connection(where, timeout=timeout):
                _REACHED[where] = True
        except OSError:
            _REACHED[where] = False
    return _REACHED[where]


def internal_first(options: dict[str, Any]) -> dict[str, Any]:
    """``internal = "auto"`` (what a resumed node is given): the region's internal
    endpoint when this machine reaches it (inside the region's VPC: no NAT gateway
    needed, no traffic billed), else the public one. Other values are left as they are."""
    if str(options.get("internal") or "").strip().lower() != "auto":
        return options
    out = {k: v for k, v in options.items() if k not in ("internal", "internal_endpoint")}
    internal = options.get("internal_endpoint")
    if not internal and options.get("region") and not options.get("endpoint_url"):
        internal = endpoint_for(str(options["region"]), internal=True)[0]
    if internal and reachable(str(internal)):
        out["endpoint_url"] = internal
    return out


def _credentials() -> dict[str, str] | None:
    key, secret = os.environ.get("OSS_ACCESS_KEY_ID"), os.environ.get("OSS_ACCESS_KEY_SECRET")
    if not (key and secret):
        return None
    creds = {"aws_access_key_id": key, "aws_secret_access_key": secret}
    if os.environ.get("OSS_SESSION_TOKEN"):
        creds["aws_session_token"] = os.environ["OSS_SESSION_TOKEN"]
    return creds


def _forbid_overwrite(request: Any, **_: Any) -> None:
    """Turn S3's ``If-None-Match: *`` into OSS's own no-overwrite header before signing."""
    if request.headers.get("If-None-Match") == "*":
        del request.headers["If-None-Match"]
        request.headers["x-oss-forbid-overwrite"] = "true"


class OSSStore(S3Store):
    """An S3Store speaking OSS's dialect."""

    scheme = "oss"

    @classmethod
    def from_url(cls, url: str, options: dict[str, Any]) -> OSSStore:
        bucket, prefix = parse_bucket_url(url, cls.scheme)
        options = internal_first(options)
        region = options.get("region") or os.environ.get("OSS_REGION")
        if not region and not options.get("endpoint_url"):
            raise ConfigError(f"{url}: OSS needs a region such as oss-cn-beijing "
                              "(--region, $BURST_REGION, $OSS_REGION or the config file)")
        settings = dict(options)
        if as_bool(options, "bucket_endpoint", False) and not options.get("endpoint_url"):
            raise ConfigError(f"{url}: bucket_endpoint needs endpoint_url, the bucket's own "
                              "domain (e.g. https://ckpt.example.com)")
        if region:
            endpoint, signing_region = endpoint_for(region, as_bool(options, "internal", False))
            settings.setdefault("endpoint_url", endpoint)
            settings["region"] = signing_region
        keys = _credentials()
        client = make_client(settings, addressing_style="virtual", credentials=keys,
                             bucket=bucket,
                             botocore_session=None if keys else own_identity_session(options))
        client.meta.events.register("before-sign.s3.PutObject", _forbid_overwrite)
        return cls(bucket, prefix, client, url=url.rstrip("/"),
                   part_size=as_int(options, "part_size", DEFAULT_PART_SIZE),
                   workers=as_int(options, "workers", DEFAULT_WORKERS))

"""Alibaba Cloud ECS RAM-role credentials for boto3: an OSS store's own identity on a node.

``node_identity = "own"`` forwards no keys: the node signs with its role's short-lived
credentials. boto3 finds AWS's (instance metadata, a web-identity token) by itself, but
knows nothing of Alibaba's, so an ``oss://`` store opened on an ECS or ACK node with a RAM
role attached asks ECS's metadata service (``100.100.100.200``, ``$BURST_METADATA_URL``
elsewhere) for ``AccessKeyId``/``AccessKeySecret``/``SecurityToken``, hardened mode
first, and hands boto3 credentials it refreshes before they expire (a run lasts longer
than one token). The STS token travels as ``x-amz-security-token``, as boto3 sends it on
OSS's S3-compatible API. Where nothing answers there, the provider steps aside and
boto3's own chain goes on.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import botocore.credentials
import botocore.session

from burst.contract import ENV_METADATA_URL
from burst.errors import ConfigError

ECS_METADATA = "http://100.100.100.200"
ROLE_ENV = "ALIBABA_CLOUD_ECS_METADATA"  # the role's name, as Alibaba's own SDKs read it
LISTING = "/latest/meta-data/ram/security-credentials/"
TOKEN_TTL = "21600"
TIMEOUT = 2.0  # a link-local service answers at once, or this is not an ECS instance


class EcsRamRole(botocore.credentials.CredentialProvider):
    """A boto3 credential provider reading the instance's RAM role."""

    METHOD = "alibaba-ecs-ram-role"
    CANONICAL_NAME = "AlibabaEcsRamRole"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        environ = os.environ if environ is None else environ
        self.base = (environ.get(ENV_METADATA_URL) or ECS_METADATA).rstrip("/")
        self.role = environ.get(ROLE_ENV) or ""

    def load(self) -> botocore.credentials.RefreshableCredentials | None:
        """Credentials that refresh themselves; None where no ECS metadata answers."""
        try:
            first = self.fetch()
        except (urllib.error.URLError, OSError) as exc:
            if isinstance(exc, urllib.error.HTTPError):
                raise ConfigError(f"node_identity is \"own\" but ECS metadata ({self.base}) "
                                  f"gives this node no RAM role credentials ({exc.code}): "
                                  "attach a RAM role to the instance") from None
            return None
        return botocore.credentials.RefreshableCredentials.create_from_metadata(
            metadata=first, refresh_using=self.fetch, method=self.METHOD)

    def fetch(self) -> dict[str, str]:
        """The role's current credentials, in botocore's metadata shape."""
        headers = {}
        token = self._session_token()
        if token:
            headers["X-aliyun-ecs-metadata-token"] = token
        role = self.role or self._get(LISTING, headers).split()[0]
        answer = json.loads(self._get(LISTING + urllib.parse.quote(role), headers))
        try:
            return {"access_key": answer["AccessKeyId"], "secret_key": answer["AccessKeySecret"],
                    "token": answer["SecurityToken"], "expiry_time": answer["Expiration"]}
        except (KeyError, TypeError):
            raise ConfigError(f"ECS metadata's RAM role {role!r} answer lacks AccessKeyId, "
                              "AccessKeySecret or SecurityToken") from None

    def _session_token(self) -> str:
        try:
            return self._request("PUT", "/latest/api/token",
                                 {"X-aliyun-ecs-metadata-token-ttl-seconds": TOKEN_TTL})
        except urllib.error.HTTPError:
            return ""  # not in hardened mode

    def _get(self, path: str, headers: dict[str, str]) -> str:
        return self._request("GET", path, headers)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local
        request = urllib.request.Request(self.base + path, headers=headers, method=method)
        with opener.open(request, timeout=TIMEOUT) as response:
            return response.read(65536).decode("utf-8", "replace").strip()


def own_identity_session(options: Mapping[str, Any]) -> botocore.session.Session | None:
    """A botocore session whose credential chain also asks ECS's RAM role (before AWS's
    instance metadata), for a store whose ``node_identity`` is ``own``; None otherwise."""
    if str(options.get("node_identity") or "").strip().lower() != "own":
        return None
    session = botocore.session.Session()
    resolver = session.get_component("credential_provider")
    resolver.insert_before("iam-role", EcsRamRole())
    return session

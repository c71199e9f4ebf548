"""A node's own identity on 127.0.0.1: the metadata services and STS that hand a node its
role's temporary credentials, as the clouds answer them.

- AWS IMDSv2: ``PUT /latest/api/token`` (with the TTL header) first; every read needs that
  token; ``/latest/meta-data/iam/security-credentials/`` lists the role, ``.../<role>``
  holds ``AccessKeyId``, ``SecretAccessKey``, ``Token``.
- Alibaba ECS (hardened mode): the same token dance with ``X-aliyun-ecs-metadata-*``,
  ``/latest/meta-data/ram/security-credentials/<role>`` holds ``AccessKeyId``,
  ``AccessKeySecret``, ``SecurityToken``.
- STS ``AssumeRoleWithWebIdentity`` (a form POST to ``/``): answers only the expected web
  identity token for the expected role.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from tests.helpers.loopback_http import Served

ROLE = "burst-node-role"
ROLE_ARN = "arn:aws:iam::123456789012:role/burst-node-role"
WEB_TOKEN = "eyJ-a-web-identity-token"


@dataclass
class RoleMetadata(Served):
    access_key: str
    secret_key: str
    session_token: str
    asked: list[str] = field(default_factory=list)  # "METHOD path" of every request
    _aws_token: str = "imds-session-token"
    _ecs_token: str = "ecs-session-token"

    @property
    def url(self) -> str:
        return self.endpoint

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode() if length else ""
        status, text = self.answer(handler.command, handler.path, handler.headers, body)
        data = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def answer(self, method: str, path: str, headers, body: str) -> tuple[int, str]:
        self.asked.append(f"{method} {path}")
        if method == "POST" and path == "/":
            return self._sts(parse_qs(body))
        if method == "PUT" and path == "/latest/api/token":
            if headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 200, self._aws_token
            if headers.get("X-aliyun-ecs-metadata-token-ttl-seconds"):
                return 200, self._ecs_token
            return 400, ""
        aws = "/latest/meta-data/iam/security-credentials/"
        ecs = "/latest/meta-data/ram/security-credentials/"
        if path.startswith(aws):
            if headers.get("X-aws-ec2-metadata-token") != self._aws_token:
                return 401, ""  # IMDSv2 only: no token, no answer
            return self._role(path[len(aws):], {
                "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": self.access_key,
                "SecretAccessKey": self.secret_key, "Token": self.session_token,
                "Expiration": "2099-01-01T00:00:00Z"})
        if path.startswith(ecs):
            if headers.get("X-aliyun-ecs-metadata-token") != self._ecs_token:
                return 403, ""
            return self._role(path[len(ecs):], {
                "Code": "Success", "AccessKeyId": self.access_key,
                "AccessKeySecret": self.secret_key, "SecurityToken": self.session_token,
                "Expiration": "2099-01-01T00:00:00Z", "LastUpdated": "2026-12-07T00:00:00Z"})
        return 404, ""

    @staticmethod
    def _role(rest: str, credentials: dict) -> tuple[int, str]:
        if rest == "":
            return 200, ROLE
        if rest == ROLE:
            return 200, json.dumps(credentials)
        return 404, ""

    def _sts(self, form: dict[str, list[str]]) -> tuple[int, str]:
        def one(name: str) -> str:
            return (form.get(name) or [""])[0]

        if one("Action") != "AssumeRoleWithWebIdentity" or one("RoleArn") != ROLE_ARN or \
                one("WebIdentityToken") != WEB_TOKEN:
            return 403, ("<ErrorResponse><Error><Code>AccessDenied</Code><Message>Not "
                         "authorized to perform sts:AssumeRoleWithWebIdentity</Message>"
                         "</Error></ErrorResponse>")
        return 200, ("<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>"
                     f"<Credentials><AccessKeyId>{self.access_key}</AccessKeyId>"
                     f"<SecretAccessKey>{self.secret_key}</SecretAccessKey>"
                     f"<SessionToken>{self.session_token}</SessionToken>"
                     "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                     "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")

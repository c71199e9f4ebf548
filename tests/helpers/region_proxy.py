"""An S3 endpoint on 127.0.0.1 that behaves as AWS does about a bucket's region and its
temporary credentials, in front of a real S3 server (SeaweedFS or moto).

- A request signed for another region than the bucket's gets what AWS answers: 400
  ``AuthorizationHeaderMalformed`` naming the right ``<Region>`` (and the
  ``x-amz-bucket-region`` header, which a HEAD's empty answer carries alone).
- A signed request must hold: a key the proxy knows, the session token issued with it
  (``x-amz-security-token``) when it is a temporary key, and a SigV4 signature over the
  request as it arrived; else 403, as IAM answers.
- An unsigned request goes upstream unsigned, so the upstream's own refusal answers it.
- Everything else is signed afresh with the upstream's keys and relayed; a HeadBucket's
  answer carries ``x-amz-bucket-region``, as AWS's does (boto3 reads the region there).
"""

from __future__ import annotations

import http.client
import re
import ssl
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlparse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.helpers.loopback_http import Served, answer

_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                   r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_NOT_FORWARDED = _HOP | {"host", "authorization", "x-amz-date", "x-amz-content-sha256",
                         "x-amz-security-token", "expect", "content-length", "user-agent"}


@dataclass
class Seen:
    """One request as it arrived: what the proxy checks, for the tests' assertions."""

    method: str
    path: str
    region: str | None  # the credential scope's region; None: unsigned
    access_key: str | None
    token: str | None
    status: int = 0


@dataclass
class RegionProxy(Served):
    upstream: str
    ca_bundle: str | None
    region: str  # the bucket's region: a signature must name it
    keys: dict[str, tuple[str, str | None]]  # access key -> (secret, session token or None)
    upstream_keys: tuple[str, str]
    bound_bucket: str | None = None  # serve /<key> as /<bucket>/<key> (an OSS custom domain)
    seen: list[Seen] = field(default_factory=list)

    # -- one request --------------------------------------------------------------------

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        match = _AUTH.fullmatch(handler.headers.get("Authorization", ""))
        seen = Seen(handler.command, handler.path, match.group(3) if match else None,
                    match.group(1) if match else None,
                    handler.headers.get("x-amz-security-token"))
        self.seen.append(seen)
        if match is None and "Authorization" in handler.headers:
            seen.status = self._error(handler, 400, "InvalidArgument", "")
        elif match is None:
            seen.status = self._relay(handler, body, signed=False)
        elif match.group(3) != self.region:
            seen.status = self._error(
                handler, 400, "AuthorizationHeaderMalformed",
                f"<Message>the region '{match.group(3)}' is wrong; expecting "
                f"'{self.region}'</Message><Region>{self.region}</Region>")
        elif match.group(1) not in self.keys:
            seen.status = self._error(handler, 403, "InvalidAccessKeyId", "")
        elif seen.token != self.keys[match.group(1)][1]:
            seen.status = self._error(handler, 403, "InvalidToken", "")
        elif not self._signed_correctly(handler, match):
            seen.status = self._error(handler, 403, "SignatureDoesNotMatch", "")
        else:
            seen.status = self._relay(handler, body, signed=True)

    def _signed_correctly(self, handler: BaseHTTPRequestHandler, match: re.Match) -> bool:
        secret, token = self.keys[match.group(1)]
        signed = match.group(4).split(";")
        request = AWSRequest(method=handler.command,
                             url=f"http://{handler.headers['Host']}{handler.path}",
                             headers={name: handler.headers.get(name, "") for name in signed})
        request.context["timestamp"] = handler.headers.get("X-Amz-Date", "")
        auth = S3SigV4Auth(Credentials(match.group(1), secret, token), "s3", self.region)
        canonical = auth.canonical_request(request)
        return auth.signature(auth.string_to_sign(request, canonical), request) == match.group(5)

    def _error(self, handler: BaseHTTPRequestHandler, status: int, code: str,
               more: str) -> int:
        body = f"<Error><Code>{code}</Code>{more}</Error>".encode()
        self._answer(handler, status, {"Content-Type": "application/xml",
                                       "x-amz-bucket-region": self.region}, body)
        return status

    def _relay(self, handler: BaseHTTPRequestHandler, body: bytes, signed: bool) -> int:
        target = urlparse(self.upstream)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _NOT_FORWARDED}
        path = f"/{self.bound_bucket}{handler.path}" if self.bound_bucket else handler.path
        if signed:
            request = AWSRequest(method=handler.command, url=f"{self.upstream}{path}",
                                 data=body, headers=headers)
            S3SigV4Auth(Credentials(*self.upstream_keys), "s3", "us-east-1").add_auth(request)
            headers = dict(request.prepare().headers)
        if target.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_bundle)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                target.hostname, target.port, context=context, timeout=60)
        else:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        try:
            conn.request(handler.command, path, body=body or None, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP}
        finally:
            conn.close()
        if handler.command == "HEAD" and path.split("?")[0].strip("/").count("/") == 0:
            kept["x-amz-bucket-region"] = self.region  # HeadBucket, as AWS answers it
        self._answer(handler, response.status, kept, answer)
        return response.status

    _answer = staticmethod(answer)

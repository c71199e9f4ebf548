"""A bucket-bound domain on 127.0.0.1: what an Alibaba OSS custom (CNAME) domain serves.

A request for ``/<key>`` on the proxy is a request for ``/<bucket>/<key>`` upstream. Like
OSS behind a custom domain, the proxy checks the client's SigV4 signature over the request
*as it arrived* (this host, path ``/<key>``), and answers 403 ``SignatureDoesNotMatch``
when it does not hold; then it signs the rewritten request afresh for the upstream S3
server (a real one: moto or SeaweedFS) and relays the answer.
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
class CnameProxy(Served):
    upstream: str
    ca_bundle: str | None
    bucket: str
    access_key: str
    secret_key: str
    region: str  # the signing region the client must use
    upstream_region: str = "us-east-1"
    paths: list[str] = field(default_factory=list)  # every path asked for, as received

    # -- one request --------------------------------------------------------------------

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        self.paths.append(handler.path)
        if not self._signed_correctly(handler):
            self._answer(handler, 403, {"Content-Type": "application/xml"},
                         b"<Error><Code>SignatureDoesNotMatch</Code>"
                         b"<Message>bad signature</Message></Error>")
            return
        status, headers, answer = self._forward(handler, f"/{self.bucket}{handler.path}", body)
        self._answer(handler, status, headers, answer)

    def _signed_correctly(self, handler: BaseHTTPRequestHandler) -> bool:
        match = _AUTH.fullmatch(handler.headers.get("Authorization", ""))
        if not match or match.group(1) != self.access_key or match.group(3) != self.region:
            return False
        signed = match.group(4).split(";")
        request = AWSRequest(method=handler.command,
                             url=f"http://{handler.headers['Host']}{handler.path}",
                             headers={name: handler.headers.get(name, "") for name in signed})
        request.context["timestamp"] = handler.headers.get("X-Amz-Date", "")
        auth = S3SigV4Auth(Credentials(self.access_key, self.secret_key), "s3", self.region)
        canonical = auth.canonical_request(request)
        expected = auth.signature(auth.string_to_sign(request, canonical), request)
        return expected == match.group(5)

    def _forward(self, handler: BaseHTTPRequestHandler, path: str, body: bytes
                 ) -> tuple[int, dict[str, str], bytes]:
        target = urlparse(self.upstream)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _NOT_FORWARDED}
        request = AWSRequest(method=handler.command, url=f"{self.upstream}{path}",
                             data=body, headers=headers)
        S3SigV4Auth(Credentials(self.access_key, self.secret_key), "s3",
                    self.upstream_region).add_auth(request)
        prepared = request.prepare()
        if target.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_bundle)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                target.hostname, target.port, context=context, timeout=60)
        else:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        try:
            conn.request(handler.command, path, body=body or None, headers=dict(prepared.headers))
            response = conn.getresponse()
            answer = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP}
            return response.status, kept, answer
        finally:
            conn.close()

    _answer = staticmethod(answer)

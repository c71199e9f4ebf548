"""A fault-injecting HTTP proxy on 127.0.0.1, in front of a real S3 server.

boto3 talks plain HTTP to the proxy, which forwards each request (Host header and SigV4
signature untouched) to the upstream HTTPS server and relays the answer, unless a rule
says to break it. Rules match a method and a regular expression on the path and query,
fire a given number of times (``times=None``: every time), and do one of:

- ``500`` / ``503``: answer with that status and an S3 error body, without forwarding;
- ``slowdown``: 503 with the ``SlowDown`` code (S3 throttling);
- ``reset-request``: read half the request body, then reset the connection (RST);
- ``reset-response``: forward, send the headers and half the body, then RST;
- ``truncate``: forward, send the headers (full Content-Length) and half the body, close;
- ``drop-response``: forward (the server applies it), then RST with no answer;
- ``corrupt``: forward, flip one byte of the response body;
- ``slow``: read the request body and send the response body in small delayed chunks;
- ``lie``: answer 200 with an ETag and store nothing (a broken gateway or cache);
- ``latency``: forward, then hold the answer for :data:`LATENCY` seconds (a store far
  away: what another writer does meanwhile lands first).
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

KINDS = ("500", "503", "slowdown", "reset-request", "reset-response", "truncate",
         "drop-response", "corrupt", "slow", "lie", "latency")
LATENCY = 1.0
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


@dataclass
class Rule:
    kind: str
    method: str = ".*"
    path: str = ".*"
    times: int | None = 1
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        return bool(re.fullmatch(self.method, method) and re.search(self.path, path))


@dataclass
class FaultProxy:
    upstream: str
    ca_bundle: str | None
    rules: list[Rule] = field(default_factory=list)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, fault
    # method, path, the request's Range header (None: none), body bytes sent back
    served: list[tuple[str, str, str | None, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, method: str = ".*", path: str = ".*",
            times: int | None = 1) -> Rule:
        assert kind in KINDS, kind
        rule = Rule(kind, method, path, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def fired(self, kind: str | None = None) -> int:
        return sum(1 for _, _, fault in self.log if fault != "-" and kind in (None, fault))

    def choose(self, method: str, path: str) -> str | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.fired += 1
                    self.log.append((method, path, rule.kind))
                    return rule.kind
            self.log.append((method, path, "-"))
        return None

    def record(self, method: str, path: str, ranged: str | None, sent: int) -> None:
        with self._lock:
            self.served.append((method, path, ranged, sent))

    def connection(self) -> http.client.HTTPConnection:
        target = urlparse(self.upstream)
        if target.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_bundle)
            return http.client.HTTPSConnection(target.hostname, target.port, context=context,
                                               timeout=60)
        return http.client.HTTPConnection(target.hostname, target.port, timeout=60)


def start(proxy: FaultProxy) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``proxy`` on a free loopback port; returns the server and its endpoint URL."""

    class Handler(_Handler):
        config = proxy

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="fault-proxy").start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    config: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _handle(self) -> None:
        fault = self.config.choose(self.command, self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if fault == "reset-request":
            self.rfile.read(length // 2)
            return self._reset()
        body = self._read_body(length, slow=fault == "slow")
        if fault in ("500", "503", "slowdown"):
            return self._error(fault)
        if fault == "lie":
            return self._lie()
        status, headers, payload = self._forward(body)
        if fault == "drop-response":
            return self._reset()
        if fault == "latency":
            time.sleep(LATENCY)
        if fault == "corrupt" and payload:
            payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
        # recorded before the client can have its answer: a test that reads ``served`` once
        # its call returned must find the request there
        ranged = self.headers.get("Range")
        cut = fault in ("reset-response", "truncate") and len(payload) > 1
        if self.command != "HEAD":  # a HEAD sends no body: not a request served
            self.config.record(self.command, self.path, ranged,
                               len(payload) // 2 if cut else len(payload))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command == "HEAD":  # the upstream's length, for a body never sent
            self.end_headers()
            return None
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if cut:
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            return self._reset() if fault == "reset-response" else self._close()
        self._write(payload, slow=fault == "slow")
        return None

    def _read_body(self, length: int, slow: bool) -> bytes:
        if not slow:
            return self.rfile.read(length)
        chunks, left = [], length
        while left:
            chunk = self.rfile.read(min(64 << 10, left))
            chunks.append(chunk)
            left -= len(chunk)
            time.sleep(0.01)
        return b"".join(chunks)

    def _write(self, payload: bytes, slow: bool) -> None:
        step = 64 << 10 if slow else len(payload) or 1
        for start in range(0, len(payload), step):
            self.wfile.write(payload[start : start + step])
            if slow:
                self.wfile.flush()
                time.sleep(0.01)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = self.config.connection()
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP
                    and (k.lower() != "content-length" or self.command == "HEAD")]
            return response.status, kept, payload
        finally:
            conn.close()

    def _error(self, fault: str) -> None:
        status, code = {"500": (500, "InternalError"), "503": (503, "ServiceUnavailable"),
                        "slowdown": (503, "SlowDown")}[fault]
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected {fault}</Message></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _lie(self) -> None:
        self.send_response(200)
        self.send_header("ETag", '"d41d8cd98f00b204e9800998ecf8427e"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed peer would."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _close(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_WR)

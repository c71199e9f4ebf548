"""A test's HTTP server on a free port of 127.0.0.1, serving while its ``with`` block runs.

The test stand-ins for real services (an S3 endpoint that checks regions, an OSS custom
domain, a cloud's metadata service) differ only in how they answer one request; this is
the rest, written once: subclass, implement :meth:`Served.handle`, enter it.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Served:
    """Hands every request (any method) to :meth:`handle` while entered."""

    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "enter the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        served = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def _any(self) -> None:
                served.handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                         name="test-http").start()
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str],
           body: bytes) -> None:
    """Send an S3-style answer: a HEAD carries the object's size and never a body."""
    handler.send_response(status)
    for key, value in headers.items():
        if key.lower() != "content-length":
            handler.send_header(key, value)
    length = headers.get("Content-Length") or headers.get("content-length")
    if handler.command == "HEAD" and length is not None:
        handler.send_header("Content-Length", length)  # the object's size, no body
    else:
        handler.send_header("Content-Length", str(len(body)) if handler.command != "HEAD"
                            else "0")
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)

"""Whether pip here can reach a package index, found out once rather than pin by pin.

A machine with no index (an air-gapped lab, a Beijing host without a mirror) would
otherwise wait out pip's connection timeout for every pin of a lock of hundreds. One probe
before the first download, or the first batch failing on a connection, decides; the pins
then come from the environment being frozen (:mod:`burst.env.wheelhouse.repack`).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import unquote, urlsplit

from burst.env.wheelhouse import pip
from burst.env.wheelhouse.house import Say
from burst.redact import strip_url

_CONNECTION = re.compile(r"(NewConnectionError|Connection refused|Failed to establish a new "
                         r"connection|Name or service not known|Temporary failure in name "
                         r"resolution|Network is unreachable|No route to host|timed out|"
                         r"Max retries exceeded|Could not fetch URL)[^\n]*")
_TRUE = ("1", "true", "yes", "on")
UNREACHABLE = "package index unreachable"  # how a pin pip could not fetch for that says so


def connection_line(output: str) -> str | None:
    """pip's complaint that it could not reach an index, or None."""
    match = _CONNECTION.search(output or "")
    return match.group(0).strip()[:200] if match else None


def unreachable(text: str | None) -> bool:
    return bool(text and text.startswith(UNREACHABLE))


def as_unreachable(why: str) -> str:
    return why if unreachable(why) else f"{UNREACHABLE}: {why}"


def offline(say: Say) -> str | None:
    """Why pip here can reach no package index (None: it may): ``no-index`` configured, or
    every configured index refusing or not resolving. One probe instead of a timeout per
    pin; behind a proxy the probe cannot tell, and pip's own failures decide."""
    done = pip.run([*pip.command(), "config", "list"], timeout=60)
    config: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        config[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")  # the last scope wins
    if config.get("find-links"):
        return None  # pip may find the pins there: its own failures decide
    if config.get("no-index", "").lower() in _TRUE:
        why = "pip is configured with no-index"
    elif config.get("proxy") or any(os.environ.get(v) for v in (
            "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")):
        return None
    else:
        urls = [config.get("index-url") or "https://pypi.org/simple",
                *config.get("extra-index-url", "").split()]
        if any(_reachable(url) for url in urls):
            return None
        why = f"no configured index answers ({', '.join(strip_url(u) for u in urls)})"
    say(f"{UNREACHABLE} ({why}): wheels come from this environment")
    return why


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(unquote(parts.path)).exists()
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return True  # not ours to judge
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=3).close()
    except OSError:
        return False
    return True

"""Stores: where snapshots live. ``open_store(url)`` picks the backend from the URL scheme."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from burst.errors import ConfigError
from burst.store.base import Store, check_key
from burst.store.local import LocalStore
from burst.store.memory import MemoryStore

DEFAULT_STORE_ENV = "BURST_STORE"
DEFAULT_STORE = ".burst"

__all__ = ["LocalStore", "MemoryStore", "Store", "check_key", "default_store_url", "open_store"]


def default_store_url() -> str:
    """The embedded default: ``$BURST_STORE`` or ``./.burst`` (a local directory)."""
    return os.environ.get(DEFAULT_STORE_ENV) or DEFAULT_STORE


def open_store(url: str | os.PathLike[str] | Store | None = None) -> Store:
    """Return the store for ``url``: a plain path or ``file://``, or ``memory://name``."""
    if url is None:
        url = default_store_url()
    if isinstance(url, Store):
        return url
    url = os.fspath(url)
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// URLs must be local paths, got {url!r}")
        return LocalStore(parsed.path if scheme == "file" else url)
    if scheme == "memory":
        return MemoryStore(parsed.netloc or parsed.path.strip("/") or "default")
    raise ConfigError(f"unsupported store URL {url!r}: use a path, file://, or memory://")

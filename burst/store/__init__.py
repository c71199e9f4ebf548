"""Stores: where snapshots live. ``open_store(url)`` picks the backend from the URL scheme.

One backend family per module: ``local`` (paths, ``file://``), ``memory`` (tests), ``s3``
(boto3; AWS and S3-compatible services), ``oss`` (Alibaba OSS on the S3 code), ``gcs``
(gcsfs, optional) and ``sftp`` (fsspec over paramiko). Settings come from flags, the
environment and ``~/.config/burst/config.toml`` (see :mod:`burst.store.settings`).

A backend's module is imported when a URL of its scheme is opened (or its class is asked
for: ``LocalStore`` and ``MemoryStore`` load on first use, PEP 562), so ``burst ls`` on a
directory never imports boto3 or paramiko, and an ``s3://`` user never pays for the others.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from burst.contract import ENV_LOCAL, ENV_STORE
from burst.errors import ConfigError
from burst.store.base import Store, TransientStoreError, check_key
from burst.store.settings import resolve

if TYPE_CHECKING:
    from burst.store.local import LocalStore
    from burst.store.memory import MemoryStore

DEFAULT_STORE = ".burst"

__all__ = ["LocalStore", "MemoryStore", "Store", "TransientStoreError", "check_key",
           "default_local_url", "default_store_url", "is_local", "open_store"]

SCHEMES = ("file", "memory", "s3", "oss", "gs", "sftp")

_LAZY = {"LocalStore": "burst.store.local", "MemoryStore": "burst.store.memory"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this hook
        return value
    raise AttributeError(f"module 'burst.store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def default_store_url() -> str:
    """The embedded default: ``$BURST_STORE`` or ``./.burst`` (a local directory)."""
    return os.environ.get(ENV_STORE) or DEFAULT_STORE


def default_local_url() -> str:
    """The local tier in front of a remote store: ``$BURST_LOCAL`` or ``./.burst``."""
    return os.environ.get(ENV_LOCAL) or DEFAULT_STORE


def is_local(store: Store) -> bool:
    """True for stores on this machine (a directory or memory): no upload queue needed."""
    from burst.store.local import LocalStore
    from burst.store.memory import MemoryStore

    return isinstance(store, LocalStore | MemoryStore)


def open_store(url: str | os.PathLike[str] | Store | None = None, **flags: Any) -> Store:
    """Return the store for ``url``: a path or ``file://``, ``memory://``, ``s3://``,
    ``oss://``, ``gs://``, ``sftp://``, or the name of a ``[stores.NAME]`` config section.

    ``flags`` (endpoint_url, region, ...) override the environment and the config file.
    Nothing here touches the network: a bad bucket or credential shows on first use.
    """
    if url is None:
        url = default_store_url()
    if isinstance(url, Store):
        return url
    url, options = resolve(os.fspath(url), flags)
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// URLs must be local paths, got {url!r}")
        from burst.store.local import LocalStore

        return LocalStore(parsed.path if scheme == "file" else url)
    if scheme == "memory":
        from burst.store.memory import MemoryStore

        return MemoryStore(parsed.netloc or parsed.path.strip("/") or "default")
    if scheme == "s3":
        from burst.store.s3 import S3Store

        return S3Store.from_url(url, options)
    if scheme == "oss":
        from burst.store.oss import OSSStore

        return OSSStore.from_url(url, options)
    if scheme in ("gs", "gcs"):
        from burst.store.gcs import GCSStore

        return GCSStore(url, options)
    if scheme in ("sftp", "ssh"):
        from burst.store.sftp import SFTPStore

        return SFTPStore(url, options)
    raise ConfigError(f"unsupported store URL {url!r}: use a path, "
                      f"{', '.join(s + '://' for s in SCHEMES)}")

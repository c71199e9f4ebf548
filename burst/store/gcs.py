"""Google Cloud Storage through fsspec's ``gcsfs`` (``gs://bucket/prefix``), imported lazily.

GCS objects appear whole or not at all, so a plain upload is already atomic; the
conditional create is GCS's own ``ifGenerationMatch=0`` (gcsfs ``mode="create"``).
Credentials are whatever gcsfs finds (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud, the
metadata server). ``pip install 'burst-failover[gcs]'`` brings gcsfs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from burst.errors import ConfigError, StoreError
from burst.store.base import (
    Pace,
    TransientStoreError,
    addressable,
    check_key,
    check_prefix,
    check_range,
)
from burst.store.s3 import DEFAULT_PART_SIZE, DEFAULT_WORKERS, parse_bucket_url
from burst.store.settings import as_int


def _filesystem(options: dict[str, Any]) -> Any:
    try:
        import gcsfs
    except ImportError:
        raise ConfigError("gs:// needs gcsfs: pip install 'burst-failover[gcs]'") from None
    kwargs: dict[str, Any] = {"project": options.get("project"), "skip_instance_cache": True}
    if options.get("endpoint_url"):
        kwargs["endpoint_url"] = options["endpoint_url"]
    return gcsfs.GCSFileSystem(**kwargs)


class GCSStore:
    """Objects under ``gs://bucket/prefix/``."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.bucket, self.prefix = parse_bucket_url(url, "gs")
        self.url = url.rstrip("/")
        self.fs = _filesystem(options)
        self.part_size = as_int(options, "part_size", DEFAULT_PART_SIZE)
        self._pool = ThreadPoolExecutor(as_int(options, "workers", DEFAULT_WORKERS),
                                        thread_name_prefix="burst-gcs")

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self.prefix}{check_key(key)}"

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self._errors(f"writing {key}"):
            self.fs.pipe_file(self._path(key), bytes(data))

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Stream the file through a resumable upload session (gcsfs), a part at a time;
        the object appears when the session closes, and a failed one is cancelled."""
        with self._errors(f"writing {key}"), open(path, "rb") as source:
            remote = self.fs.open(self._path(key), "wb", block_size=self.part_size)
            try:
                while chunk := source.read(self.part_size):
                    if pace is not None:
                        pace(len(chunk))
                    remote.write(chunk)
            except BaseException:
                with contextlib.suppress(Exception):
                    remote.discard()  # cancel the session: nothing partial becomes visible
                remote.closed = True  # and closing (at collection) must not commit it
                raise
            remote.close()

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        try:
            with self._errors(f"writing {key}"):
                self.fs.pipe_file(self._path(key), bytes(data), mode="create")
        except _Exists:
            return False
        return True

    def get(self, key: str) -> bytes:
        with self._errors(f"reading {key}"):
            return self.fs.cat_file(self._path(key))

    def read_into(self, key: str, buffer: memoryview) -> int:
        size = self.size(key)
        if size is None:
            raise KeyError(key)
        wanted = min(size, len(buffer))

        def fetch(start: int) -> None:
            end = min(start + self.part_size, wanted)
            with self._errors(f"reading {key}"):
                buffer[start:end] = self.fs.cat_file(self._path(key), start=start, end=end)

        for future in [self._pool.submit(fetch, s) for s in range(0, wanted, self.part_size)]:
            future.result()
        return size

    def read_range(self, key: str, start: int, length: int) -> bytes | bytearray:
        """``cat_file(start, end)`` in parallel parts of ``part_size`` for a long range."""
        size = self.size(key)
        if size is None:
            raise KeyError(key)
        check_range(self.url, key, start, length, size)
        filled = bytearray(length)
        out = memoryview(filled)

        def fetch(offset: int) -> None:
            end = min(offset + self.part_size, length)
            with self._errors(f"reading {key}"):
                data = self.fs.cat_file(self._path(key), start=start + offset, end=start + end)
            if len(data) != end - offset:
                raise StoreError(f"{self.url}: {key} changed size while being read")
            out[offset:end] = data

        for future in [self._pool.submit(fetch, s) for s in range(0, length, self.part_size)]:
            future.result()
        return filled  # the parts wrote into it in place

    def size(self, key: str) -> int | None:
        try:
            with self._errors(f"checking {key}"):
                return int(self.fs.info(self._path(key))["size"])
        except KeyError:
            return None

    def list(self, prefix: str) -> list[str]:
        check_prefix(prefix)
        root = f"{self.bucket}/{self.prefix}"
        base = root + (prefix.rsplit("/", 1)[0] if "/" in prefix else "")
        with self._errors(f"listing {prefix or '/'}"):
            found = self.fs.find(base.rstrip("/"))
        keys = (path[len(root):] for path in found if path.startswith(root))
        return addressable([k for k in keys if k.startswith(prefix)])

    def delete(self, key: str) -> None:
        with contextlib.suppress(KeyError), self._errors(f"deleting {key}"):
            self.fs.rm_file(self._path(key))

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise KeyError(what) from None
        except FileExistsError:
            raise _Exists from None
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise TransientStoreError(f"{self.url}: {what}: {_one_line(exc)}") from None
        except Exception as exc:  # gcsfs raises HttpError and auth errors of many kinds
            raise StoreError(f"{self.url}: {what} failed: {_one_line(exc)}") from None


class _Exists(Exception):
    """The conditional create found the object already there."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

"""The ``Store`` protocol: the one interface every storage backend implements.

A store is a flat namespace of keys under a root URL. Keys look like relative POSIX paths
(``<run-id>/blobs/ab/ab12...``). Writes are all-or-nothing: a reader sees either the
whole object or nothing, never a prefix of it. That single guarantee is what makes the
snapshot commit (blobs first, manifest last) crash-safe on every backend.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from burst.errors import SnapshotError, StoreError

# used with fullmatch: "$" would also accept a trailing newline ("run\n" as a key segment)
_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9._=+@-]+")


# Called with a byte count before that many bytes of a file are sent (from any thread): a
# throttle's ``wait`` (burst.staging.parts.Throttle) paces a background upload with it, and
# it may raise to stop the upload, which keeps what landed for the next try.
Pace = Callable[[int], None]


class TransientStoreError(StoreError):
    """A failure worth retrying: throttling, a 5xx, a reset or timed-out connection.

    Backends translate their SDK's errors into this (retry) or a plain ``StoreError``
    (do not: wrong credentials, missing bucket), so the retry policy needs no SDK knowledge.
    """


@runtime_checkable
class Store(Protocol):
    """Key/value object storage with atomic writes."""

    url: str

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` under ``key`` atomically, replacing any previous object."""

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Write the file at ``path`` under ``key``, as atomically as :meth:`put`, reading
        it from disk as it goes (a 900 MB torch wheel never sits whole in memory).

        Large files go up in parts where the backend has them (S3, OSS: in parallel, and
        an upload a failed or killed try left open is continued, not restarted); ``pace``
        is called before each part or chunk is sent."""

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        """Write only if ``key`` does not exist; return False (and write nothing) if it does.

        Atomic where the backend can make it so (a local hard link, S3 ``If-None-Match``,
        OSS ``x-oss-forbid-overwrite``, an SFTP rename); elsewhere a check then a write.
        """

    def get(self, key: str) -> bytes:
        """Return the whole object; raise ``KeyError`` if it does not exist."""

    def read_into(self, key: str, buffer: memoryview) -> int:
        """Fill ``buffer`` from the object; return the object's size (may exceed the buffer)."""

    def read_range(self, key: str, start: int, length: int) -> bytes | bytearray:
        """Return ``length`` bytes of the object from byte ``start`` (one ranged read, so a
        rank restoring its shard fetches only its rows; a store that reads in parallel parts
        gives the bytearray they filled); raise ``KeyError`` if it does not exist and
        ``StoreError`` if it ends before ``start + length``."""

    def size(self, key: str) -> int | None:
        """Return the object's size in bytes, or None if it does not exist."""

    def list(self, prefix: str) -> list[str]:
        """Return every key that starts with ``prefix``, sorted."""

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""


# Top-level names a store keeps for itself, beside the runs: ``wheels/`` holds the
# wheelhouse every run of the store shares (burst.env.wheelhouse), ``inputs/`` the chunks
# of the runs' data sets and hub caches (burst.inputs.chunks).
SHARED_PREFIXES = frozenset({"wheels", "preflight", "inputs"})  # preflight: burst check's probes


def check_range(url: str, key: str, start: int, length: int, size: int) -> None:
    """Refuse a range a backend was asked to read: negative, or past the object's end."""
    if start < 0 or length < 0:
        raise StoreError(f"{url}: refusing to read {key} from {start} for {length} bytes")
    if start + length > size:
        raise StoreError(f"{url}: {key} is {size} bytes, shorter than the "
                         f"{start + length} a read of bytes {start}..{start + length} needs")


def check_key(key: str) -> str:
    """Reject keys that could escape the store root or a run's prefix.

    Keys come from manifests, which may be hostile; a key with ``..``, an absolute path,
    a backslash or an empty segment is refused before any backend sees it.
    """
    if not key or key.startswith("/") or "\\" in key:
        raise SnapshotError(f"refusing unsafe store key {key!r}")
    for segment in key.split("/"):
        if segment in ("", ".", "..") or not _SAFE_SEGMENT.fullmatch(segment):
            raise SnapshotError(f"refusing unsafe store key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """Reject listing prefixes that could reach outside the store root (``../``, ``/etc``).

    A prefix is a key cut anywhere (``run/snapshots/``, ``run/bl``, or empty for all), so
    each complete segment obeys :func:`check_key` and the last, partial one may be empty.
    """
    if not prefix:
        return prefix
    *whole, last = prefix.split("/")
    if whole:
        check_key("/".join(whole))
    if last and (last in (".", "..") or not _SAFE_SEGMENT.fullmatch(last)):
        raise SnapshotError(f"refusing unsafe store prefix {prefix!r}")
    if prefix.startswith("/") or "\\" in prefix:
        raise SnapshotError(f"refusing unsafe store prefix {prefix!r}")
    return prefix


def addressable(keys: list[str]) -> list[str]:
    """The keys of a listing that :func:`check_key` accepts, sorted.

    A listing comes from the server (or a directory someone else filled); a key such as
    ``run/env/../../x`` or one with a space can never be read or deleted through burst, so
    it is left out rather than allowed to fail a pull or a GC halfway.
    """
    out = []
    for key in keys:
        try:
            out.append(check_key(key))
        except SnapshotError:
            continue
    return sorted(out)

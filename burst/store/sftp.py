"""Stores on any SSH server: ``sftp://user@host[:port]/path``, through fsspec's SFTP backend.

Two collaborators hold what is not the transfers themselves: :mod:`burst.store.sftpsession`
connects (host keys verified, settings from ``~/.ssh/config``, one connection per thread)
and turns paramiko's failures into store errors; :mod:`burst.store.sftproot` resolves where
a key is written or deleted, so that nothing is written through a symbolic link out of the
store's root.

Writes go to a hidden temporary file in the target directory and are renamed into place:
``posix-rename`` (atomic replace) for ``put``, the plain SFTP rename (which OpenSSH refuses
when the target exists) for ``put_if_absent``.

A killed upload leaves its temporary (``.<name>.<random>.tmp``), invisible to listings.
Nothing on the server says whether its writer lives, so :meth:`SFTPStore.sweep_temporaries`
judges by the server's own clock: a temporary nobody wrote to for the given age is dead,
unless it is the temporary of a key the caller names as still being uploaded.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import time
import uuid
from collections.abc import Collection, Iterable, Iterator
from typing import Any, BinaryIO

import paramiko

from burst.store.base import (
    Pace,
    TransientStoreError,
    addressable,
    check_prefix,
    check_range,
)
from burst.store.sftproot import RootGuard
from burst.store.sftpsession import Sessions, connection_settings

CHUNK = 1 << 20  # written to the channel this much at a time (paramiko pipelines them)


def _chunks(source: BinaryIO, pace: Pace | None) -> Iterator[bytes]:
    """A file's bytes a chunk at a time, each paced before it is read."""
    while True:
        if pace is not None:
            pace(CHUNK)
        chunk = source.read(CHUNK)
        if not chunk:
            return
        yield chunk


Found = list[tuple[str, paramiko.SFTPAttributes]]  # files a walk found, with their attributes


def _is_temporary(name: str) -> bool:
    """Whether a file's name is an upload's temporary (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp") and name.count(".") >= 3


class SFTPStore:
    """Files under a directory of an SSH server; keys are relative paths."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.host, self.root, kwargs = connection_settings(url, options)
        known_hosts = kwargs.pop("known_hosts")
        self.kwargs = kwargs
        self.url = url.rstrip("/")
        self.sessions = Sessions(self.url, self.host, known_hosts, kwargs)
        self._inside = RootGuard(self.url, self.root, self.sessions.ftp)

    def close(self) -> None:
        self.sessions.close()

    # -- the Store protocol -------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self.sessions.errors(f"writing {key}"):
            tmp, path = self._upload_temp(key, data)
            try:
                self.sessions.ftp().posix_rename(tmp, path)
            except BaseException:
                self._remove(tmp)
                raise

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Stream the file into a temporary beside ``key``, then rename it into place."""
        with self.sessions.errors(f"writing {key}"), open(path, "rb") as source:
            tmp, target = self._upload_temp(key, _chunks(source, pace))
            try:
                self.sessions.ftp().posix_rename(tmp, target)
            except BaseException:
                self._remove(tmp)
                raise

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        with self.sessions.errors(f"writing {key}"):
            self._inside.placed(key)  # refused before anything is read through a link out
            if self.size(key) is not None:
                return False
            tmp, path = self._upload_temp(key, data)
            try:
                # OpenSSH: link()+unlink(), which fails if path exists
                self.sessions.ftp().rename(tmp, path)
            except OSError:
                if self.size(key) is not None:
                    return False
                raise
            finally:
                self._remove(tmp)
        return True

    def get(self, key: str) -> bytes:
        size = self.size(key)
        if size is None:
            raise KeyError(key)
        buffer = bytearray(size)
        self.read_into(key, memoryview(buffer))
        return bytes(buffer)

    def read_into(self, key: str, buffer: memoryview) -> int:
        with self.sessions.errors(f"reading {key}"), self._open(key) as f:
            size = f.stat().st_size
            wanted = min(size, len(buffer))
            f.prefetch(wanted)
            filled = 0
            while filled < wanted:
                chunk = f.read(min(4 << 20, wanted - filled))
                if not chunk:
                    raise TransientStoreError(f"{self.url}: {key} ended early while reading")
                buffer[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
        return size

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """One ``readv`` of the range: paramiko pipelines its requests, like a prefetch."""
        with self.sessions.errors(f"reading {key}"), self._open(key) as f:
            check_range(self.url, key, start, length, f.stat().st_size)
            if not length:
                return b""
            data = next(iter(f.readv([(start, length)])))
        if len(data) != length:
            raise TransientStoreError(f"{self.url}: {key} ended early while reading")
        return data

    def _open(self, key: str) -> Any:
        """The object's remote file, opened for reading; KeyError when there is none."""
        try:
            return self.sessions.ftp().open(self._inside.path(key), "rb")
        except FileNotFoundError:
            raise KeyError(key) from None

    def size(self, key: str) -> int | None:
        with self.sessions.errors(f"checking {key}"):
            try:
                attrs = self.sessions.ftp().stat(self._inside.path(key))
            except FileNotFoundError:
                return None
            return attrs.st_size if stat.S_ISREG(attrs.st_mode or 0) else None

    def list(self, prefix: str) -> list[str]:
        start = check_prefix(prefix).rsplit("/", 1)[0] if "/" in prefix else ""
        found: Found = []
        with self.sessions.errors(f"listing {prefix or '/'}"):
            self._walk(posixpath.join(self.root, start) if start else self.root, found)
        cut = len(self.root) + 1
        return addressable([k[cut:] for k, _ in found if k[cut:].startswith(prefix)])

    def _walk(self, directory: str, out: Found, *, hidden: bool = False) -> None:
        """Every regular file under ``directory``, with its attributes; hidden ones
        (temporaries of writes in progress) only when asked for. Links are not entered
        (the server lists an entry's own attributes, a link's as a link)."""
        try:
            entries = self.sessions.ftp().listdir_attr(directory)
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.filename.startswith(".") and not hidden:
                continue
            path = f"{directory}/{entry.filename}"
            if stat.S_ISDIR(entry.st_mode or 0):
                self._walk(path, out, hidden=hidden)
            elif stat.S_ISREG(entry.st_mode or 0):
                out.append((path, entry))

    def delete(self, key: str) -> None:
        """Remove the file (a link at the key itself goes, never what it points to)."""
        with self.sessions.errors(f"deleting {key}"):
            path = self._inside.placed(key)
            if path is not None:
                self._remove(path)

    def sweep_temporaries(self, prefix: str, older_than: float, *,
                          protected: Collection[str] = (), dry_run: bool = False
                          ) -> tuple[int, int]:
        """Delete the temporaries under ``prefix`` that killed uploads left; return how
        many, and their bytes (``dry_run``: count them, delete nothing).

        A temporary counts as dead once nothing has written to it for ``older_than``
        seconds by the server's clock (a live upload writes it a chunk at a time, and
        the client's clock may differ from the server's), unless it is the temporary of
        a key in ``protected`` (a blob an upload marker names: that upload may live)."""
        start = check_prefix(prefix).rsplit("/", 1)[0] if "/" in prefix else ""
        count = size = 0
        cut = len(self.root) + 1
        with self.sessions.errors(f"sweeping temporaries under {prefix or '/'}"):
            found: Found = []
            self._walk(posixpath.join(self.root, start) if start else self.root, found,
                       hidden=True)
            temporaries = [(path[cut:], attrs) for path, attrs in found
                           if _is_temporary(path.rsplit("/", 1)[-1])
                           and path[cut:].startswith(prefix)]
            if not temporaries:
                return 0, 0
            cutoff = self._server_time() - older_than
            for key, attrs in temporaries:
                directory, name = posixpath.split(key)
                target = posixpath.join(directory, name[1:].rsplit(".", 2)[0])
                if (attrs.st_mtime or 0) >= cutoff or target in protected:
                    continue
                if not dry_run:
                    placed = self._inside.placed(key)
                    if placed is None:
                        continue
                    self._remove(placed)
                count, size = count + 1, size + (attrs.st_size or 0)
        return count, size

    # -- helpers ------------------------------------------------------------------------

    def _server_time(self) -> float:
        """The server's clock now: the time it stamps on a file written for the purpose
        (temporaries' ages are its timestamps; the client's clock may be minutes off)."""
        ftp = self.sessions.ftp()
        probe = f"{self.root}/.clock.{uuid.uuid4().hex[:12]}.probe"
        try:
            with ftp.open(probe, "wb") as f:
                f.write(b"")
            return float(ftp.stat(probe).st_mtime or time.time())
        finally:
            self._remove(probe)

    def _upload_temp(self, key: str, data: bytes | bytearray | memoryview | Iterator[bytes]
                     ) -> tuple[str, str]:
        """Write ``data`` (bytes, or chunks of them) to a new temporary beside ``key``'s
        file, in its folder as resolved and checked (:meth:`RootGuard.placed`), made if missing;
        return the temporary and where to rename it."""
        chunks: Iterable[bytes | memoryview]
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data).cast("B")
            chunks = (view[start : start + CHUNK] for start in range(0, len(view), CHUNK))
        else:
            chunks = data
        tmp, path, f = self._inside.open_temp(key)
        try:
            with f:
                f.set_pipelined(True)
                for chunk in chunks:
                    f.write(chunk)
        except BaseException:
            self._remove(tmp)
            raise
        return tmp, path

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.sessions.ftp().remove(path)

"""Where :class:`burst.store.sftp.SFTPStore` writes and deletes: inside its root on the
server, never through a symbolic link out of it.

SFTP has no ``openat``, so a write cannot pin the folders it walks; instead it asks the
server to resolve the folder it writes into (``realpath``, one round trip, the one a write
spent before to see whether the folder exists) and, if that lies inside the root (as the
server resolves it), writes the temporary and renames it in under that resolved path,
which has no link left in it. A link that stays inside the store still works; one that
leads out raises :class:`~burst.errors.LinkOutOfStoreError`. Folders a write makes are
walked one at a time with ``lstat``, a link on the way resolved and checked the same way.
Deletes resolve their folder too. What remains open: a folder of the resolved path
replaced by a link *after* the ``realpath`` and before the temporary's open or the rename
(a window of one round trip, which a local store closes and SFTP cannot: nothing in the
protocol opens a path without following links on the way). Only someone who can already
write inside the store's folder on the server can open it.

This is the store's path logic apart from its transfers: it needs only a way to this
thread's SFTP client, and owns no connection.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat
import uuid
from collections.abc import Callable
from typing import Any

import paramiko

from burst.errors import LinkOutOfStoreError, StoreError
from burst.store.base import check_key


class RootGuard:
    """Keys as paths under ``root``, and the folders they are written in, resolved by the
    server and checked to lie inside it."""

    def __init__(self, url: str, root: str, ftp: Callable[[], paramiko.SFTPClient]) -> None:
        self.url, self.root, self.ftp = url, root, ftp
        self._real_root: str | None = None  # the root as the server resolves it

    def path(self, key: str) -> str:
        """``key``'s path on the server, as spelled (links in it unresolved)."""
        return f"{self.root}/{check_key(key)}"

    def placed(self, key: str) -> str | None:
        """Where ``key`` is written or deleted: in its folder as the server resolves it,
        refused if that lies outside the root; None when a folder above that one is
        missing. The file itself is replaced or removed, never followed."""
        directory, name = posixpath.split(self.path(key))
        try:
            real = self.ftp().normalize(directory)
        except FileNotFoundError:
            return None
        self._check_inside(real, directory, key)
        return f"{real}/{name}"

    def _check_inside(self, real: str, spelled: str, key: str) -> None:
        """Refuse ``key`` when ``spelled`` (resolved by the server: ``real``) lies outside
        the root."""
        if self._real_root is None:
            self._real_root = self.ftp().normalize(self.root)
        root = self._real_root
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            raise LinkOutOfStoreError(f"{self.url}: refusing {key!r}: a symbolic link in "
                                      f"the store leads outside it ({spelled} is {real})")

    def open_temp(self, key: str) -> tuple[str, str, Any]:
        """A new temporary beside ``key``'s file, open for writing: its path, the file's,
        and the open file. A missing folder is made only when the open says so (the
        server resolves a path whose last folder is missing as if it were there)."""
        path = self.placed(key)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):  # its folder is missing
                return self._open_beside(path)
        self._makedirs(posixpath.dirname(self.path(key)), key)
        path = self.placed(key)
        if path is None:
            raise StoreError(f"{self.url}: the folder of {key} vanished while it was made")
        return self._open_beside(path)

    def _open_beside(self, path: str) -> tuple[str, str, Any]:
        directory, name = posixpath.split(path)
        tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        return tmp, path, self.ftp().open(tmp, "wb")

    def _makedirs(self, directory: str, key: str) -> None:
        """Make ``directory`` (the root and its parents plainly, as the user named them;
        below the root one folder at a time, a link on the way checked to stay inside)."""
        ftp = self.ftp()
        self._mkdirs_up(self.root)
        path = self.root
        for name in directory[len(self.root) + 1:].split("/"):
            path = f"{path}/{name}"
            try:
                mode = ftp.lstat(path).st_mode or 0
            except FileNotFoundError:
                self._mkdir(path)
                continue
            if stat.S_ISLNK(mode):
                self._check_inside(ftp.normalize(path), path, key)

    def _mkdirs_up(self, directory: str) -> None:
        ftp = self.ftp()
        missing = []
        while directory and directory != "/":
            try:
                ftp.stat(directory)
                break
            except FileNotFoundError:
                missing.append(directory)
                directory = posixpath.dirname(directory)
        for path in reversed(missing):
            self._mkdir(path)

    def _mkdir(self, path: str) -> None:
        ftp = self.ftp()
        try:
            ftp.mkdir(path)
        except OSError:
            if not stat.S_ISDIR(ftp.stat(path).st_mode or 0):  # lost a race: fine if a dir
                raise

"""Stores on any SSH server: ``sftp://user@host[:port]/path``, through fsspec's SFTP backend.

The implementation is ``fsspec.implementations.sftp.SFTPFileSystem``, named explicitly:
fsspec's registry hands ``sftp://`` to the ``sshfs`` package whenever that is installed,
and a different library with different semantics should not appear by accident.

Host keys are verified. fsspec (and paramiko's default) accept an unknown host key, which
lets anyone on the path impersonate the server and receive the snapshots; burst loads the
user's known_hosts (and ``UserKnownHostsFile`` from ``~/.ssh/config``) and rejects hosts
that are not in them. Host name, port, user and identity files come from ``~/.ssh/config``
through paramiko's ``SSHConfig``, like ``ssh`` itself.

Writes go to a hidden temporary file in the target directory and are renamed into place:
``posix-rename`` (atomic replace) for ``put``, the plain SFTP rename (which OpenSSH refuses
when the target exists) for ``put_if_absent``. Each thread has its own connection, since
one SFTP channel serialises requests.

The store never writes through a symbolic link out of its root. SFTP has no ``openat``,
so a write cannot pin the folders it walks; instead it asks the server to resolve the
folder it writes into (``realpath``, one round trip, the one a write spent before to see
whether the folder exists) and, if that lies inside the root (as the server resolves it),
writes the temporary and renames it in under that resolved path, which has no link left
in it. A link that stays inside the store still works; one that leads out raises
:class:`~burst.errors.LinkOutOfStoreError`. Folders a write makes are walked one at a time
with ``lstat``, a link on the way resolved and checked the same way. Deletes resolve
their folder too. What remains open: a folder of the resolved path replaced by a link
*after* the ``realpath`` and before the temporary's open or the rename (a window of one
round trip, which a local store closes and SFTP cannot: nothing in the protocol opens a
path without following links on the way). Only someone who can already write inside the
store's folder on the server can open it.

A killed upload leaves its temporary (``.<name>.<random>.tmp``), invisible to listings.
Nothing on the server says whether its writer lives, so :meth:`SFTPStore.sweep_temporaries`
judges by the server's own clock: a temporary nobody wrote to for the given age is dead,
unless it is the temporary of a key the caller names as still being uploaded.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import os
import posixpath
import stat
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

import paramiko
from fsspec.implementations.sftp import SFTPFileSystem

from burst.errors import ConfigError, LinkOutOfStoreError, StoreError
from burst.store.base import (
    Pace,
    TransientStoreError,
    addressable,
    check_key,
    check_prefix,
    check_range,
)


class VerifiedSFTPFileSystem(SFTPFileSystem):
    """fsspec's SFTP filesystem, connecting only to hosts whose key is already known."""

    cachable = False

    def __init__(self, host: str, known_hosts: list[str], **ssh_kwargs: Any) -> None:
        self.known_hosts = known_hosts
        super().__init__(host, host_key_policy="reject", **ssh_kwargs)

    def _connect(self) -> None:
        self.client = paramiko.SSHClient()
        self.client.load_system_host_keys()  # ~/.ssh/known_hosts
        for path in self.known_hosts:
            if os.path.exists(path):
                self.client.load_host_keys(path)
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self.client.connect(self.host, **self.ssh_kwargs)
        self.ftp = self.client.open_sftp()


def connection_settings(url: str, options: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(host, root path, paramiko connect kwargs plus known_hosts) for an ``sftp://`` URL."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(f"{url!r} has an invalid port") from None
    if not parsed.hostname:
        raise ConfigError(f"{url!r} names no host: use sftp://[user@]host[:port]/path")
    root = unquote(parsed.path)
    if not root or root == "/" or parsed.query or parsed.fragment:
        raise ConfigError(f"{url!r} needs a directory path: sftp://[user@]host[:port]/path")
    config = _ssh_config(options).lookup(parsed.hostname)
    identity = options.get("identity_file")
    known = options.get("known_hosts") or config.get("userknownhostsfile")
    kwargs: dict[str, Any] = {
        "port": port or int(config.get("port", 22)),
        "username": unquote(parsed.username or "") or config.get("user") or getpass.getuser(),
        "key_filename": [os.path.expanduser(identity)] if identity else config.get("identityfile"),
        "timeout": 10, "banner_timeout": 10, "auth_timeout": 10,
        "known_hosts": [os.path.expanduser(p) for p in str(known or "").split()],
    }
    if parsed.password:
        raise ConfigError(f"{url!r} holds a password: use SSH keys or an agent")
    return config.get("hostname", parsed.hostname), root.rstrip("/"), kwargs


def _ssh_config(options: dict[str, Any]) -> paramiko.SSHConfig:
    path = Path(options.get("ssh_config") or "~/.ssh/config").expanduser()
    if not path.exists():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise ConfigError(f"cannot read SSH config {path}: {exc}") from None


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
        self.known_hosts = kwargs.pop("known_hosts")
        self.kwargs = kwargs
        self.url = url.rstrip("/")
        self._local = threading.local()
        self._all: list[VerifiedSFTPFileSystem] = []
        self._lock = threading.Lock()
        self._real_root: str | None = None  # the root as the server resolves it

    # -- connections --------------------------------------------------------------------

    def _ftp(self) -> paramiko.SFTPClient:
        fs = getattr(self._local, "fs", None)
        if fs is None:
            with self._errors("connecting"):
                fs = VerifiedSFTPFileSystem(self.host, self.known_hosts, **self.kwargs)
            self._local.fs = fs
            with self._lock:
                self._all.append(fs)
        return fs.ftp

    def close(self) -> None:
        with self._lock:
            for fs in self._all:
                with contextlib.suppress(Exception):
                    fs.client.close()
            self._all.clear()
        self._local = threading.local()

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    # -- the Store protocol -------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self._errors(f"writing {key}"):
            tmp, path = self._upload_temp(key, data)
            try:
                self._ftp().posix_rename(tmp, path)
            except BaseException:
                self._remove(tmp)
                raise

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Stream the file into a temporary beside ``key``, then rename it into place."""
        with self._errors(f"writing {key}"), open(path, "rb") as source:
            tmp, target = self._upload_temp(key, _chunks(source, pace))
            try:
                self._ftp().posix_rename(tmp, target)
            except BaseException:
                self._remove(tmp)
                raise

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        with self._errors(f"writing {key}"):
            self._placed(key)  # refused before anything is read through a link out
            if self.size(key) is not None:
                return False
            tmp, path = self._upload_temp(key, data)
            try:
                self._ftp().rename(tmp, path)  # OpenSSH: link()+unlink(), fails if path exists
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
        with self._errors(f"reading {key}"), self._open(key) as f:
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
        with self._errors(f"reading {key}"), self._open(key) as f:
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
            return self._ftp().open(self._path(key), "rb")
        except FileNotFoundError:
            raise KeyError(key) from None

    def size(self, key: str) -> int | None:
        with self._errors(f"checking {key}"):
            try:
                attrs = self._ftp().stat(self._path(key))
            except FileNotFoundError:
                return None
            return attrs.st_size if stat.S_ISREG(attrs.st_mode or 0) else None

    def list(self, prefix: str) -> list[str]:
        start = check_prefix(prefix).rsplit("/", 1)[0] if "/" in prefix else ""
        found: Found = []
        with self._errors(f"listing {prefix or '/'}"):
            self._walk(posixpath.join(self.root, start) if start else self.root, found)
        cut = len(self.root) + 1
        return addressable([k[cut:] for k, _ in found if k[cut:].startswith(prefix)])

    def _walk(self, directory: str, out: Found, *, hidden: bool = False) -> None:
        """Every regular file under ``directory``, with its attributes; hidden ones
        (temporaries of writes in progress) only when asked for. Links are not entered
        (the server lists an entry's own attributes, a link's as a link)."""
        try:
            entries = self._ftp().listdir_attr(directory)
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
        with self._errors(f"deleting {key}"):
            path = self._placed(key)
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
        with self._errors(f"sweeping temporaries under {prefix or '/'}"):
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
                    placed = self._placed(key)
                    if placed is None:
                        continue
                    self._remove(placed)
                count, size = count + 1, size + (attrs.st_size or 0)
        return count, size

    # -- helpers ------------------------------------------------------------------------

    def _placed(self, key: str) -> str | None:
        """Where ``key`` is written or deleted: in its folder as the server resolves it,
        refused if that lies outside the root; None when a folder above that one is
        missing. The file itself is replaced or removed, never followed."""
        directory, name = posixpath.split(self._path(key))
        try:
            real = self._ftp().normalize(directory)
        except FileNotFoundError:
            return None
        self._check_inside(real, directory, key)
        return f"{real}/{name}"

    def _check_inside(self, real: str, spelled: str, key: str) -> None:
        if self._real_root is None:
            self._real_root = self._ftp().normalize(self.root)
        root = self._real_root
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            raise LinkOutOfStoreError(f"{self.url}: refusing {key!r}: a symbolic link in "
                                      f"the store leads outside it ({spelled} is {real})")

    def _server_time(self) -> float:
        """The server's clock now: the time it stamps on a file written for the purpose
        (temporaries' ages are its timestamps; the client's clock may be minutes off)."""
        ftp = self._ftp()
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
        file, in its folder as resolved and checked (:meth:`_placed`), made if missing;
        return the temporary and where to rename it."""
        chunks: Iterable[bytes | memoryview]
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data).cast("B")
            chunks = (view[start : start + CHUNK] for start in range(0, len(view), CHUNK))
        else:
            chunks = data
        tmp, path, f = self._open_temp(key)
        try:
            with f:
                f.set_pipelined(True)
                for chunk in chunks:
                    f.write(chunk)
        except BaseException:
            self._remove(tmp)
            raise
        return tmp, path

    def _open_temp(self, key: str) -> tuple[str, str, Any]:
        """A new temporary beside ``key``'s file, open for writing: its path, the file's,
        and the open file. A missing folder is made only when the open says so (the
        server resolves a path whose last folder is missing as if it were there)."""
        path = self._placed(key)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):  # its folder is missing
                return self._open_beside(path)
        self._makedirs(posixpath.dirname(self._path(key)), key)
        path = self._placed(key)
        if path is None:
            raise StoreError(f"{self.url}: the folder of {key} vanished while it was made")
        return self._open_beside(path)

    def _open_beside(self, path: str) -> tuple[str, str, Any]:
        directory, name = posixpath.split(path)
        tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        return tmp, path, self._ftp().open(tmp, "wb")

    def _makedirs(self, directory: str, key: str) -> None:
        """Make ``directory`` (the root and its parents plainly, as the user named them;
        below the root one folder at a time, a link on the way checked to stay inside)."""
        ftp = self._ftp()
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
        ftp = self._ftp()
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
        ftp = self._ftp()
        try:
            ftp.mkdir(path)
        except OSError:
            if not stat.S_ISDIR(ftp.stat(path).st_mode or 0):  # lost a race: fine if a dir
                raise

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._ftp().remove(path)

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        where = f"{self.url}"
        try:
            yield
        except (KeyError, StoreError):
            raise
        except paramiko.BadHostKeyException:
            raise StoreError(f"{where}: the host key of {self.host} CHANGED: refusing to connect "
                             "(check it, then fix known_hosts)") from None
        except paramiko.AuthenticationException as exc:
            raise StoreError(f"{where}: SSH authentication failed ({exc}): check the user "
                             "and key (IdentityFile in ~/.ssh/config)") from None
        except paramiko.SSHException as exc:
            if "known_hosts" in str(exc):
                raise StoreError(f"{where}: {self.host} is not in known_hosts: verify its key "
                                 "and add it (ssh-keyscan, then compare fingerprints)") from None
            raise TransientStoreError(f"{where}: SSH error while {what}: {exc}") from None
        except (TimeoutError, paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, EOFError) as exc:
            raise TransientStoreError(f"{where}: cannot reach {self.host}:"
                                      f"{self.kwargs['port']} while {what}: "
                                      f"{' '.join(str(exc).split())}") from None
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM) or "ermission" in str(exc):
                raise StoreError(f"{where}: permission denied while {what}") from None
            raise StoreError(f"{where}: {what} failed: {' '.join(str(exc).split())}") from None

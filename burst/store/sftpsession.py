"""Connections to one SSH server for :class:`burst.store.sftp.SFTPStore`: where to connect,
host keys verified, one connection per thread, and paramiko's failures as store errors.

The implementation is ``fsspec.implementations.sftp.SFTPFileSystem``, named explicitly:
fsspec's registry hands ``sftp://`` to the ``sshfs`` package whenever that is installed,
and a different library with different semantics should not appear by accident.

Host keys are verified. fsspec (and paramiko's default) accept an unknown host key, which
lets anyone on the path impersonate the server and receive the snapshots; burst loads the
user's known_hosts (and ``UserKnownHostsFile`` from ``~/.ssh/config``) and rejects hosts
that are not in them. Host name, port, user and identity files come from ``~/.ssh/config``
through paramiko's ``SSHConfig``, like ``ssh`` itself.

Each thread has its own connection, since one SFTP channel serialises requests. This is
the store's session handling apart from what it does with a session (fsspec keeps the
same split: the connection in ``_connect``, the file operations over ``self.ftp``).
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import paramiko
from fsspec.implementations.sftp import SFTPFileSystem

from burst.errors import ConfigError, StoreError
from burst.store.base import TransientStoreError


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


class Sessions:
    """The store's connections to ``host``: one per thread, made on first use, all closed
    by :meth:`close`; :meth:`errors` says what went wrong in the store's words."""

    def __init__(self, url: str, host: str, known_hosts: list[str], kwargs: dict[str, Any]
                 ) -> None:
        self.url, self.host, self.known_hosts, self.kwargs = url, host, known_hosts, kwargs
        self._local = threading.local()
        self._all: list[VerifiedSFTPFileSystem] = []
        self._lock = threading.Lock()

    def filesystem(self) -> VerifiedSFTPFileSystem:
        """This thread's connection, made first if it has none."""
        fs = getattr(self._local, "fs", None)
        if fs is None:
            with self.errors("connecting"):
                fs = VerifiedSFTPFileSystem(self.host, self.known_hosts, **self.kwargs)
            self._local.fs = fs
            with self._lock:
                self._all.append(fs)
        return fs

    def ftp(self) -> paramiko.SFTPClient:
        """This thread's SFTP client, connecting first if it has none."""
        return self.filesystem().ftp

    def close(self) -> None:
        with self._lock:
            for fs in self._all:
                with contextlib.suppress(Exception):
                    fs.client.close()
            self._all.clear()
        self._local = threading.local()

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """paramiko's and the server's failures while doing ``what``, as one-line store
        errors: transient (retried) when the network failed, final otherwise."""
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

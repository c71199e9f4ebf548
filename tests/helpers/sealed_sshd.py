"""An OpenSSH server inside a sealed root: a rented GPU box that has only the system.

``burst resume --to ssh://`` must work on a box that has nothing of this machine: not the
source tree, the user's venv, pip's configuration, a local store or a package index. A
test's sshd that shares this machine's files proves nothing about that box, so this one
runs ``/usr/sbin/sshd -D -e`` in a sealed node (:mod:`burst.launch.sealed`): its own mount
and pid namespaces, a tmpfs root with the system's ``/usr``, ``/lib*``, ``/bin``,
``/sbin`` and ``/etc`` read-only (minus pip/uv configuration and ``/usr/local/lib/python3*``),
and a network namespace with only ``lo``, into which the store's ports are relayed out
(:class:`~burst.launch.sealed.Loopback`) and the SSH port in
(:class:`~burst.launch.sealed.Inbound`): every package index is unreachable for real.

The box's one writable place besides its own tmpfs root is ``base/box`` (bound at the same
path, so the test reads the node's outputs here); its host key and authorized_keys are
generated there. The login user is root, as on most rented GPU boxes; its ``HOME``
(``/root``) is a fresh directory on the box's tmpfs root, not this machine's. sshd's
``SetEnv`` points pip and uv at a dead loopback port too, so a tool that tries an index
fails at once. Leaving the context kills the namespace's processes (SIGKILL to ``unshare``,
whose child, pid 1 of the box, takes every process of the box with it).
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from burst.launch import sealed
from tests.helpers.store_servers import free_port, wait_until

SSHD = "/usr/sbin/sshd"
USER = "root"
#: Capabilities a login must not have, but sshd's privilege separation needs CAP_SYS_CHROOT
#: (its pre-auth child chroots into /run/sshd).
#: What every login sees (sshd's ``SetEnv``): no package index, quickly.
LOGIN_ENV = {"PIP_INDEX_URL": sealed.DEAD_INDEX, "UV_INDEX_URL": sealed.DEAD_INDEX,
             "UV_DEFAULT_INDEX": sealed.DEAD_INDEX, "PIP_DEFAULT_TIMEOUT": "5",
             "PIP_RETRIES": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@dataclass(frozen=True)
class SealedBox:
    """What a test needs to reach the box: ``ssh://root@127.0.0.1:PORT`` with this key."""

    port: int
    known_hosts: Path
    client_key: Path
    box: Path  # read-write on the box at the same path (node directories go here)
    log: Path  # sshd's output

    @property
    def url(self) -> str:
        return f"ssh://{USER}@127.0.0.1:{self.port}"


def problem() -> str | None:
    """Why this machine cannot run a sealed sshd (None: it can)."""
    if not Path(SSHD).exists():
        return "openssh-server is not installed (scripts/test.sh installs it)"
    return sealed.problem()


def _keys(box: Path, port: int) -> tuple[Path, Path]:
    """A host key and a client key for this box; known_hosts and authorized_keys for them."""
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(box / name)],
                       check=True)
    (box / "authorized_keys").write_text((box / "client_key.pub").read_text())
    host_pub = " ".join((box / "host_key.pub").read_text().split()[:2])
    known_hosts = box / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    return known_hosts, box / "client_key"


def _config(box: Path, port: int) -> Path:
    setenv = " ".join(f"{k}={v}" for k, v in LOGIN_ENV.items())
    config = box / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {box / 'host_key'}\n"
        f"AuthorizedKeysFile {box / 'authorized_keys'}\nPidFile none\n"
        "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
        "UseDNS no\nPrintMotd no\nPrintLastLog no\nMaxSessions 50\nMaxStartups 50\n"
        f"SetEnv {setenv}\n")
    return config


def _command(node: sealed.Node, config: Path, network: sealed.Loopback) -> list[str]:
    """``sealed.command`` for sshd: the same sealed root, but sshd keeps CAP_SYS_CHROOT
    (every other capability the task must not have is still dropped)."""
    script = (f"mkdir -p -m 0755 /run/sshd && mkdir -p -m 0700 /root && "
              f"exec {SSHD} -D -e -f {shlex.quote(str(config))}")
    return sealed.command(node, script, network, keep_caps=("sys_chroot",))


def _banner(port: int) -> bool:
    """sshd answers through the relay (a bare TCP connect only proves the relay listens)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.settimeout(2)
        return conn.recv(64).startswith(b"SSH-2.0-")


@contextlib.contextmanager
def sealed_sshd(base: Path, store_ports: Iterable[int] = ()) -> Iterator[SealedBox]:
    """Run sshd in a sealed box under ``base`` whose network reaches only ``store_ports``
    of this machine's 127.0.0.1; yields how to log in. Everything dies on exit."""
    why = problem()
    if why:
        raise sealed.SealError(f"cannot run a sealed sshd: {why}")
    box = base / "box"
    box.mkdir(parents=True)
    port = free_port()
    known_hosts, client_key = _keys(box, port)
    config = _config(box, port)
    node = sealed.Node(base / "root", box)
    node.prepare()
    log = base / "sshd.log"
    with sealed.Loopback(store_ports) as network, sealed.Inbound(network.path, [port]), \
            open(log, "wb") as out:
        process = subprocess.Popen(_command(node, config, network), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={"PATH": sealed.STOCK_PATH})
        try:
            wait_until(lambda: _banner(port), "sealed sshd", process, timeout=60, log=log)
            yield SealedBox(port, known_hosts, client_key, box, log)
        finally:
            process.kill()  # unshare: --kill-child takes the box's pid 1, and so every process
            process.wait(10)

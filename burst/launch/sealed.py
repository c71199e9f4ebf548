"""A sealed node for the local stub: a task that runs here sees only what a cloud node sees.

A stub node that shares this machine's files proves nothing about a cloud node: the user's
venv, the source tree, pip's configuration and its local wheels would quietly stand in for
what the node must get from the store. So each stub node runs in namespaces of its own
(``unshare --mount --pid --fork``): a new root on a tmpfs holding the system's ``/usr``,
``/lib*``, ``/bin``, ``/sbin`` and ``/etc`` bound read-only (minus pip and uv configuration
and the Python packages installed under ``/usr/local/lib/python3*``, which a cloud image's
``python3`` does not have), a fresh ``/tmp``, ``/proc`` and a minimal ``/dev``, the node's
own directory as ``HOME`` (bound read-write at the same path, so its outputs are readable
here) and, for a ``file://`` store, that directory: nothing else. The root is switched
with ``pivot_root`` and the old one unmounted, so nothing of this machine stays reachable,
and the task runs without ``CAP_SYS_ADMIN`` (it cannot remount its way back).

The network is sealed too when the store is on this machine's loopback (a test's S3 or
SFTP server) or on disk: the node gets a network namespace with only a loopback device,
into which the store's ports are relayed (:class:`Loopback`); package indexes and the
internet are then unreachable for real, as from a node behind the Great Firewall, not only
by configuration. The environment points pip and uv at a dead loopback port anyway, so a
tool that tries an index fails at once instead of after a DNS timeout.

The system directories can come from another root than this machine's (``system``, e.g.
a ``debootstrap`` of another distribution, ``$BURST_STUB_SYSTEM``): the node then runs that
distribution's ``python3`` and libraries, as a cloud image that is not this machine would.

Where a node cannot be sealed (not root, no ``unshare``, ``pivot_root`` or ``setpriv``),
:func:`problem` says why and the stub runs the node unsealed, with a warning and a
``node-unsealed`` event in the run's history (a dry run says so too);
``BURST_STUB_SEAL=require`` turns that into an error (tests that must not pass on an
unsealed node), ``off`` skips sealing.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import glob
import os
import shlex
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from burst.contract import ENV_ENDPOINT_URL, ENV_STORE, ENV_TEMPLATES
from burst.errors import BurstError, ConfigError

SEAL_ENV = "BURST_STUB_SEAL"
SYSTEM_ENV = "BURST_STUB_SYSTEM"  # a directory holding another distribution's root
MODES = ("auto", "require", "off")
STOCK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_PYTHON = "/usr/bin/python3"
DEAD_INDEX = "http://127.0.0.1:9/simple/"  # the discard port: nothing listens, connects refuse
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
#: What a cloud node does not have although it lives under the system directories.
HIDDEN = ("/etc/pip.conf", "/etc/pip", "/etc/xdg/pip", "/etc/uv", "/usr/local/lib/python3*",
          "/usr/local/etc/pip*")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DROPPED_CAPS = "-sys_admin,-sys_module,-sys_ptrace,-sys_chroot,-net_admin,-mknod"
CLONE_NEWNET = 0x40000000
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class SealError(BurstError):
    """This machine cannot seal a node (not root, no namespaces), and sealing was required."""


@dataclass(frozen=True)
class Node:
    """One sealed node: its mount point for the new root, its HOME, what else it is given."""

    root: Path  # an empty directory here; the node's tmpfs root is mounted on it privately
    home: Path  # read-write, at the same path inside (the stub reads the node's outputs)
    binds: tuple[Path, ...] = ()  # further read-write directories (a file:// store)
    system: Path = Path("/")  # whose /usr, /lib, /etc the node gets (read-only)

    def prepare(self) -> None:
        """Create what the mounts need here (a store directory may not exist yet)."""
        for path in (self.root, self.home, *self.binds):
            path.mkdir(parents=True, exist_ok=True)


def mode(explicit: str | None = None) -> str:
    """``auto`` (seal where the machine allows, else say so), ``require`` or ``off``."""
    value = (explicit or os.environ.get(SEAL_ENV) or "auto").strip().lower()
    if value not in MODES:
        raise ConfigError(f"${SEAL_ENV}={value!r}: use one of {', '.join(MODES)}")
    return value


def system_root(explicit: str | Path | None = None) -> Path:
    """The root the node's system directories come from: ``explicit``, else
    ``$BURST_STUB_SYSTEM``, else this machine's ``/``; one without ``bash`` and ``setpriv``
    (the node's shell and what drops its capabilities) is refused in one line."""
    value = explicit or os.environ.get(SYSTEM_ENV) or "/"
    root = Path(value).expanduser().resolve()
    missing = [tool for tool in ("bash", "setpriv") if not _has(root, tool)]
    if missing:
        raise ConfigError(f"the sealed node's system root {root} holds no "
                          f"{' or '.join(missing)}: give a distribution's root (debootstrap "
                          "--variant=minbase SUITE DIR)")
    return root


def environment(base: Mapping[str, str], home: Path) -> dict[str, str]:
    """The node's environment: ``base`` (the task's envs, secrets, ``SKYPILOT_*``) with a
    stock PATH, the node's HOME and every package index pointed at a dead port."""
    env = {k: v for k, v in base.items() if not k.startswith(("PIP_", "UV_", "PYTHON"))
           or k in ("PYTHONHASHSEED", "PYTHONUNBUFFERED")}
    env.update({"PATH": STOCK_PATH, "HOME": str(home), "PIP_INDEX_URL": DEAD_INDEX,
                "PIP_DEFAULT_TIMEOUT": "5", "PIP_RETRIES": "0", "UV_INDEX_URL": DEAD_INDEX,
                "UV_DEFAULT_INDEX": DEAD_INDEX, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    for name in ("TMPDIR", "VIRTUAL_ENV", "CONDA_PREFIX", ENV_TEMPLATES):
        env.pop(name, None)
    return env


def command(node: Node, script: str, network: Loopback | None = None,
            keep_caps: tuple[str, ...] = ()) -> list[str]:
    """The argv that runs ``bash -c script`` in the sealed ``node`` (and its network).

    ``keep_caps`` keeps capabilities the node otherwise loses (an sshd's privilege
    separation needs ``sys_chroot``); every other one in :data:`DROPPED_CAPS` is dropped."""
    argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation",
            "private", "--", "/bin/sh", "-c", enter_script(node, keep_caps), "sealed-node",
            script]
    if network is not None:
        argv = ["nsenter", f"--net={network.path}", "--", *argv]
    return argv


def enter_script(node: Node, keep_caps: tuple[str, ...] = ()) -> str:
    """The shell that assembles the node's root, switches to it and runs ``$1`` there."""
    lines = ["set -eu", f"R={shlex.quote(str(node.root))}",
             'mount -t tmpfs -o mode=0755 sealed-node "$R"']
    hidden = _hidden(node.system)
    for name in SYSTEM:
        lines += _place(node.system / name, hidden, Path("/") / name)
    lines += _kernel_and_devices()
    for path in (node.home, *node.binds):
        target = shlex.quote(str(path))
        lines += [f'mkdir -p "$R"{target}', f'mount --bind {target} "$R"{target}']
    home = shlex.quote(str(node.home))
    lines += ['cd "$R"', "mkdir .old", "pivot_root . .old", "umount -l /.old", "rmdir /.old",
              f"cd {home}"]
    dropped = ",".join(cap for cap in DROPPED_CAPS.split(",")
                       if cap.lstrip("-") not in keep_caps)
    lines.append(f'exec setpriv --bounding-set={dropped} -- /bin/bash -c "$1"')
    return "\n".join(lines) + "\n"


def _has(system: Path, tool: str) -> bool:
    """Whether the node's system root has ``tool`` (it runs there, after the switch)."""
    return any((system / d / tool).exists() for d in ("usr/bin", "bin", "usr/sbin", "sbin"))


def _hidden(system: Path = Path("/")) -> set[Path]:
    return {Path(p) for pattern in HIDDEN
            for p in glob.glob(str(system / pattern.lstrip("/")))}


def _place(source: Path, hidden: set[Path], inside: Path | None = None) -> list[str]:
    """Lines that put ``source`` at ``$R/inside`` (default: its own path) read-only,
    leaving out ``hidden`` paths: a directory holding a hidden path becomes a read-only
    tmpfs of its other entries."""
    inside = source if inside is None else inside
    target = '"$R"' + shlex.quote(str(inside))
    if source in hidden:
        return []
    if source.is_symlink():
        return [f"ln -s {shlex.quote(os.readlink(source))} {target}"]
    if source.is_dir():
        if not any(source in h.parents for h in hidden):
            return [f"mkdir -p {target}", f"mount -o bind,ro {shlex.quote(str(source))} {target}"]
        lines = [f"mkdir -p {target}", f"mount -t tmpfs -o mode=0755 sealed-filtered {target}"]
        for child in sorted(source.iterdir()):
            lines += _place(child, hidden, inside / child.name)
        return [*lines, f"mount -o remount,ro {target}"]
    if source.is_file():
        return [f"touch {target}", f"mount -o bind,ro {shlex.quote(str(source))} {target}"]
    return []  # sockets, fifos: nothing a node needs


def _kernel_and_devices() -> list[str]:
    lines = ['mkdir -p "$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/run" "$R/var/tmp"',
             'chmod 1777 "$R/var/tmp"',
             'mount -t proc -o nosuid,nodev,noexec proc "$R/proc"',
             'mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys" 2>/dev/null'
             ' || mount -o rbind,ro /sys "$R/sys"',
             'mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$R/tmp"',
             'mount -t tmpfs -o mode=0755,nosuid,nodev run "$R/run"',
             'mount -t tmpfs -o mode=0755,nosuid dev "$R/dev"']
    devices = [f"/dev/{d}" for d in DEVICES if os.path.exists(f"/dev/{d}")]
    devices += sorted(glob.glob("/dev/nvidia*"))  # the node's GPUs, as a cloud node has them
    for device in devices:
        quoted = shlex.quote(device)
        lines += [f'touch "$R"{quoted}', f'mount --bind {quoted} "$R"{quoted}']
    lines += ['ln -s /proc/self/fd "$R/dev/fd"', 'ln -s /proc/self/fd/0 "$R/dev/stdin"',
              'ln -s /proc/self/fd/1 "$R/dev/stdout"', 'ln -s /proc/self/fd/2 "$R/dev/stderr"',
              'mkdir "$R/dev/shm"', 'mount -t tmpfs -o mode=1777,nosuid,nodev shm "$R/dev/shm"']
    return lines


# -- can this machine seal a node? --------------------------------------------------------


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why this machine cannot seal a node, in a few words; None when it can (tried once)."""
    if os.geteuid() != 0:
        return "namespaces need root"
    # looked up as the node's shell will look them up: on the stock PATH it is given
    # looked up as the node's shell will look them up: on the stock PATH it is given;
    # without setpriv the task would keep CAP_SYS_ADMIN and could remount its way out
    missing = [t for t in ("unshare", "nsenter", "pivot_root", "mount", "setpriv")
               if not shutil.which(t, path=STOCK_PATH)]
    if missing:
        return f"{', '.join(missing)} not found"
    with tempfile.TemporaryDirectory(prefix="burst-seal-probe-") as tmp:
        node = Node(Path(tmp) / "root", Path(tmp) / "home")
        node.root.mkdir()
        node.home.mkdir()
        try:
            with Loopback(()) as network:
                done = subprocess.run(command(node, "exit 0", network), capture_output=True,
                                      text=True, env={"PATH": STOCK_PATH}, timeout=60,
                                      check=False)
        except (OSError, SealError, subprocess.TimeoutExpired) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        return lines[0] if lines else f"unshare exited {done.returncode}"
    return None


# -- the network ------------------------------------------------------------------------


def store_ports(envs: Mapping[str, str]) -> list[int] | None:
    """The loopback ports the task's store needs ([] for a store on disk); None when the
    store is not on this machine (a real cloud bucket: the node needs this machine's
    network)."""
    store = envs.get(ENV_STORE, "")
    parsed = urlparse(store)
    if parsed.scheme in ("", "file"):
        return []
    endpoint = urlparse(envs.get(ENV_ENDPOINT_URL) or store)
    try:
        port = endpoint.port or {"http": 80, "https": 443, "sftp": 22}.get(endpoint.scheme)
    except ValueError:
        return None
    if endpoint.hostname in LOOPBACK_HOSTS and port:
        return [port]
    return None


def store_dirs(envs: Mapping[str, str]) -> list[Path]:
    """A ``file://`` store's directory: the one thing of this machine a node is given."""
    parsed = urlparse(envs.get(ENV_STORE, ""))
    if parsed.scheme not in ("", "file") or not parsed.path:
        return []
    return [Path(parsed.path)]


class _Relays:
    """Listeners on this machine's 127.0.0.1 that relay connections across a network
    namespace, and the namespace's file descriptor; closing both ends the relays."""

    def __init__(self, ports: Iterable[int]) -> None:
        self.ports = tuple(sorted(set(ports)))
        self._fd: int | None = None
        self._listeners: list[socket.socket] = []

    def _serve(self, name: str) -> None:
        for listener in self._listeners:
            threading.Thread(target=self._accept, args=(listener,), daemon=True,
                             name=name).start()

    def _accept(self, listener: socket.socket) -> None:
        raise NotImplementedError

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        for listener in self._listeners:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
            listener.close()
        self._listeners = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Loopback(_Relays):
    """A network namespace with only a loopback device, where ``ports`` of this machine's
    127.0.0.1 are relayed (the store's): everything else, package indexes included, is
    unreachable from inside. Nodes enter it with ``nsenter --net=PATH``; the nodes of one
    job share it, so they reach each other on 127.0.0.1 as the stub tells them to."""

    @property
    def path(self) -> str:
        """The namespace, as a path ``nsenter`` opens."""
        if self._fd is None:
            raise SealError("the node's network namespace is not open")
        return f"/proc/{os.getpid()}/fd/{self._fd}"

    def __enter__(self) -> Loopback:
        made: dict[str, object] = {}
        # A namespace is per thread: a short-lived thread enters a new one, brings its
        # loopback up and opens the listeners there; they stay in it after it exits.
        worker = threading.Thread(target=self._inside, args=(made,), name="burst-seal-net")
        worker.start()
        worker.join()
        if "error" in made:
            self.close()
            raise SealError(f"no network namespace for the node: {made['error']}")
        self._serve("burst-seal-relay")
        return self

    def _inside(self, made: dict[str, object]) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            self._fd = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net",
                               os.O_RDONLY)
            _loopback_up()
            for port in self.ports:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", port))
                listener.listen(64)
                self._listeners.append(listener)
        except OSError as exc:
            made["error"] = exc

    def _accept(self, listener: socket.socket) -> None:
        port = listener.getsockname()[1]
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=_relay, args=(inside, port), daemon=True,
                             name="burst-seal-conn").start()


def _loopback_up() -> None:
    """``ip link set lo up`` in the calling thread's network namespace."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(probe, siocgifflags, request))[1]
        fcntl.ioctl(probe, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def _relay(inside: socket.socket, port: int) -> None:
    """One connection from the node to this machine's ``127.0.0.1:port`` (opened from a
    thread in this machine's namespace), bytes copied both ways until both ends close."""
    try:
        outside = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        inside.close()
        return
    _splice(inside, outside)


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until both ends close."""
    for sock in (a, b):
        sock.settimeout(None)
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def popen(node: Node, script: str, env: Mapping[str, str], network: Loopback | None = None,
          **kwargs: Any) -> subprocess.Popen:
    """Start ``script`` in the sealed ``node`` with the node's ``env`` (see
    :func:`environment`); ``kwargs`` go to :class:`subprocess.Popen`."""
    node.prepare()
    return subprocess.Popen(command(node, script, network), env=dict(env), **kwargs)


class Inbound(_Relays):
    """``ports`` of this machine's 127.0.0.1 relayed *into* a sealed network namespace (the
    reverse of :class:`Loopback`): a service that runs in the sealed network (a test's SSH
    server standing in for a rented box) is reached from here as on the same port there,
    while the namespace itself still reaches nothing but what its :class:`Loopback` relays.

    ``namespace`` is a path ``setns`` opens (:attr:`Loopback.path`). Each connection is
    dialled from a thread that has entered the namespace first: a socket belongs to the
    namespace its creating thread was in."""

    def __init__(self, namespace: str, ports: Iterable[int]) -> None:
        super().__init__(ports)
        self.namespace = namespace

    def __enter__(self) -> Inbound:
        self._fd = os.open(self.namespace, os.O_RDONLY)
        try:
            for port in self.ports:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._listeners.append(listener)
                listener.bind(("127.0.0.1", port))
                listener.listen(64)
        except OSError as exc:
            self.close()
            raise SealError(f"cannot relay 127.0.0.1 ports {self.ports} into the node: "
                            f"{exc}") from None
        self._serve("burst-seal-inbound")
        return self

    def _accept(self, listener: socket.socket) -> None:
        port = listener.getsockname()[1]
        fd = self._fd
        while True:
            try:
                outside, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=_relay_in, args=(outside, fd, port), daemon=True,
                             name="burst-seal-inbound-conn").start()


def _relay_in(outside: socket.socket, namespace_fd: int | None, port: int) -> None:
    """One connection from here to ``127.0.0.1:port`` in the namespace ``namespace_fd``:
    this thread enters the namespace (for good: it ends with the connection), dials, and
    copies bytes both ways until both ends close."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if namespace_fd is None or libc.setns(namespace_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the node's network failed")
        inside = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        outside.close()
        return
    _splice(outside, inside)

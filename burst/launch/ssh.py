"""The ``ssh`` launcher: run the task on an existing GPU box (rented, a lab's, one in Beijing
that no SkyPilot cloud reaches) over SSH with paramiko.

The job must outlive the connection that started it: a laptop's Wi-Fi drops, a VPN to
Beijing resets. So the task runs detached on the box (its own session, output to a log
file, its exit code to a file when done) and this side only *tails* that log. A dropped
connection is re-opened and the tail resumes at the byte it had reached; nothing runs
twice and no output is lost.

Secrets reach the job without touching the box's disk: a tiny Python bootstrap reads them
as JSON from the SSH channel's stdin and starts the job with them in its environment.
Host keys are checked against known_hosts (the SSH config's ``UserKnownHostsFile``, else
``~/.ssh/known_hosts``); an unknown host is refused unless ``accept_new_host`` is set, and
a key accepted that way is appended to that file (as ``ssh -o StrictHostKeyChecking=
accept-new`` does), so the next connection checks it. A box behind a bastion is reached
the way ``ssh`` reaches it: the SSH config's ``ProxyJump`` (each hop's own config entry,
a ``direct-tcpip`` channel through it to the next) or ``ProxyCommand``.

The job is detached, so a resume that ends early (a closed laptop, Ctrl-C) leaves it
running: the ``ssh-job`` event in the run's history says where it is, and
:meth:`SSHLauncher.attach` (``burst resume RUN --attach``) tails it again to its end.

No SkyPilot runs on the box, so nothing sets the ``SKYPILOT_*`` variables the task's
torchrun line and ``burst node run``'s plan read. The launcher sets them itself, for one
node and one process per GPU it uses: it counts the box's GPUs (``nvidia-smi``; none on a
CPU box), takes the first GPU count the task asks for that the box has (all of them if
none fits), and hides the rest with ``CUDA_VISIBLE_DEVICES``. A CPU box runs as many ranks
as the task asks for (gloo). The world size planned and the processes started agree.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import paramiko

from burst.errors import BurstError, ConfigError
from burst.launch import LaunchResult, Reporter
from burst.launch.task import RenderedTask
from burst.parallel.launching import one_box_env

RECONNECT_SECONDS = 300.0  # how long to keep re-trying a dropped connection
POLL_SECONDS = 0.5
GPU_QUERY = "nvidia-smi --query-gpu=index --format=csv,noheader"

# Runs on the box: read the secrets from stdin, start the job detached, print its pid.
_BOOTSTRAP = r"""
import json, os, subprocess, sys
d = sys.argv[1]
extra = json.loads(sys.stdin.read() or "{}")
log = open(os.path.join(d, "job.log"), "ab")
p = subprocess.Popen(["bash", os.path.join(d, "job.sh")], cwd=d, env={**os.environ, **extra},
                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True)
open(os.path.join(d, "job.pid"), "w").write(str(p.pid))
print(p.pid)
"""

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

_JOB = """\
set -a
. ./task.env
set +a
export BURST_NODE_DIR="$PWD"
code=0
bash ./setup.sh || code=$?
if [ "$code" = 0 ]; then bash ./run.sh || code=$?; fi
echo "$code" > exit_code.tmp && mv exit_code.tmp exit_code
"""


MAX_JUMPS = 8  # a ProxyJump chain longer than this is a loop in the SSH config


@dataclass
class Target:
    """``ssh://[user@]host[:port]``, resolved through the SSH config like ``ssh`` does:
    ``jumps`` are the bastions to pass through in order (``ProxyJump``); the first hop
    (the target itself when there are none) may be reached through ``proxy_command``."""

    host: str
    connect: dict[str, Any]
    known_hosts: list[str]
    label: str
    url: str = ""
    jumps: list[Target] = field(default_factory=list)
    proxy_command: str | None = None

    @property
    def port(self) -> int:
        return int(self.connect["port"])

    @classmethod
    def parse(cls, url: str, ssh_config: str | None = None, identity: str | None = None,
              known_hosts: str | None = None) -> Target:
        parsed = urlparse(url)
        if parsed.scheme != "ssh" or not parsed.hostname or parsed.path not in ("", "/"):
            raise ConfigError(f"bad SSH target {url!r}: use ssh://[user@]host[:port]")
        if parsed.password:
            raise ConfigError(f"{url!r} holds a password: use SSH keys or an agent")
        try:
            port = parsed.port
        except ValueError:
            raise ConfigError(f"{url!r} has an invalid port") from None
        config = _ssh_config(ssh_config)
        user = unquote(parsed.username or "")
        return _resolve(config, parsed.hostname, user, port, identity, known_hosts, url, 0)


def _resolve(config: paramiko.SSHConfig, name: str, user: str, port: int | None,
             identity: str | None, known_hosts: str | None, url: str, depth: int) -> Target:
    """One host as the SSH config describes it, with the hops in front of it."""
    if depth > MAX_JUMPS:
        raise ConfigError(f"the SSH config's ProxyJump chain to {name} is longer than "
                          f"{MAX_JUMPS} hops (a loop?)")
    entry = config.lookup(name)
    user = user or entry.get("user") or _local_user()
    known = known_hosts or entry.get("userknownhostsfile") or "~/.ssh/known_hosts"
    keys = entry.get("identityfile") or ([identity] if identity else None)
    if identity and depth == 0:
        keys = [identity]
    connect = {"port": port or int(entry.get("port", 22)), "username": user,
               "key_filename": [os.path.expanduser(k) for k in keys] if keys else None,
               "timeout": 15, "banner_timeout": 15, "auth_timeout": 15}
    target = Target(entry.get("hostname", name), connect,
                    [os.path.expanduser(p) for p in str(known).split()],
                    f"{user}@{name}:{connect['port']}", url)
    jump = str(entry.get("proxyjump") or "none")
    command = str(entry.get("proxycommand") or "none")
    if jump.lower() != "none":
        for spec in jump.split(","):
            hop_user, hop_name, hop_port = _jump_spec(spec.strip())
            hop = _resolve(config, hop_name, hop_user, hop_port, identity, known_hosts, "",
                           depth + 1)
            target.jumps += [*hop.jumps, hop]  # flattened: each hop's own chain first
    elif command.lower() != "none":
        target.proxy_command = command
    return target


def _jump_spec(spec: str) -> tuple[str, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, as ProxyJump takes them."""
    parsed = urlparse(spec if spec.startswith("ssh://") else f"ssh://{spec}")
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or port == -1 or parsed.path not in ("", "/"):
        raise ConfigError(f"the SSH config's ProxyJump {spec!r} is not [user@]host[:port]")
    return unquote(parsed.username or ""), parsed.hostname, port


def _ssh_config(path: str | None) -> paramiko.SSHConfig:
    file = Path(path or "~/.ssh/config").expanduser()
    if not file.exists():
        if path:
            raise ConfigError(f"SSH config {file} does not exist")
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(file))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise ConfigError(f"cannot read SSH config {file}: {exc}") from None


def _local_user() -> str:
    import getpass

    return getpass.getuser()


@dataclass
class SSHLauncher:
    target: Target
    remote_root: str = "~/burst-node"  # each launch gets a fresh directory under it
    accept_new_host: bool = False
    python: str = "python3"  # on the box, for the 20-line bootstrap
    reconnect_seconds: float = RECONNECT_SECONDS
    kind: str = "ssh"
    _client: paramiko.SSHClient | None = field(default=None, repr=False)
    _hops: list[paramiko.SSHClient] = field(default_factory=list, repr=False)
    saved_keys: list[str] = field(default_factory=list)  # "host (file)" accepted and saved

    # -- the protocol ---------------------------------------------------------------------

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        port = self.target.connect["port"]
        user = self.target.connect["username"]
        via = ",".join(f"{h.connect['username']}@{h.host}:{h.port}" for h in self.target.jumps)
        proxy = (f" -J {via}" if via else "") + (
            f" -o ProxyCommand={shlex.quote(self.target.proxy_command)}"
            if self.target.proxy_command else "")
        box = f"ssh{proxy} -p {port} {user}@{self.target.host}"
        d = f"{self.remote_root}/{task.name}-<time>"
        names = ", ".join(secret_names) or "none"
        counts = ",".join(map(str, task_gpu_counts(task))) or "1"
        return [
            f"{box} {GPU_QUERY}  # GPUs on the box; the task asks for {counts} per node: "
            "SKYPILOT_NUM_GPUS_PER_NODE (+ CUDA_VISIBLE_DEVICES) set to match",
            f"{box} mkdir -p {d}  # then sftp: task.env (envs), setup.sh, run.sh, job.sh",
            f"{box} {self.python} -c <bootstrap> {d}  # secrets on stdin ({names}); "
            "starts `bash job.sh` detached (setsid), output to job.log",
            f"{box} tail -c +1 -f {d}/job.log  # re-opened where it stopped if the link drops",
        ]

    def launch(self, task: RenderedTask, secrets: Mapping[str, str],
               report: Reporter) -> LaunchResult:
        job = self.start(task, secrets, report)
        report.say(f"started on {self.target.label} in {job.directory} (pid {job.pid}); "
                   "streaming its log")
        return self.follow(job, report)

    def start(self, task: RenderedTask, secrets: Mapping[str, str], report: Reporter) -> Job:
        """Put the task on the box and start it detached; it runs on without us."""
        if task.num_nodes > 1:
            raise ConfigError(f"the ssh launcher runs on one box; the task asks for "
                              f"{task.num_nodes} nodes (use --nodes 1)")
        self.connect()
        for saved in self.saved_keys:
            report.say(f"accepted the new host key of {saved}")
        gpus = self._gpus(report)
        world = box_env(task_gpu_counts(task), gpus)
        report.say(f"{self.target.label}: {gpus or 'no'} GPU(s); running "
                   f"{world['SKYPILOT_NUM_GPUS_PER_NODE']} process(es)"
                   + (f" on CUDA_VISIBLE_DEVICES={world['CUDA_VISIBLE_DEVICES']}"
                      if "CUDA_VISIBLE_DEVICES" in world else ""))
        remote = self._prepare(task, world)
        pid = self._start(remote, secrets)
        job = Job(remote, pid, f"ssh:{self.target.label}:{remote}")
        report.event("ssh-job", where=job.where, pid=pid, dir=remote,
                     target=self.target.url or None)
        return job

    def follow(self, job: Job, report: Reporter) -> LaunchResult:
        """Stream the job's log from its start until it ends; its exit code is the result."""
        try:
            code = self._follow(job.directory, job.pid, report)
        finally:
            self.close()
        return LaunchResult(code, job.where, {"pid": job.pid, "dir": job.directory})

    def attach(self, directory: str, pid: int, report: Reporter) -> LaunchResult:
        """Tail a job started earlier (by a resume that has since ended) to its end."""
        self.connect()
        return self.follow(Job(directory, pid, f"ssh:{self.target.label}:{directory}"), report)

    # -- connection -----------------------------------------------------------------------

    def connect(self) -> paramiko.SSHClient:
        """Log in to the box, through its ProxyCommand or ProxyJump hops if it has any."""
        self.close()
        chain = [*self.target.jumps, self.target]
        sock: Any = None
        if chain[0].proxy_command:
            try:
                sock = paramiko.ProxyCommand(chain[0].proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise BurstError(f"the ProxyCommand for {chain[0].label} failed: {exc}"
                                 ) from None
        command = sock
        try:
            for hop, after in itertools.pairwise(chain):
                client = self._login(hop, sock, via=True)
                self._hops.append(client)
                sock = self._channel(client, hop, after)
            self._client = self._login(self.target, sock, via=False)
        except BaseException:
            self.close()
            if isinstance(command, paramiko.ProxyCommand):
                with contextlib.suppress(Exception):
                    command.close()  # its process, if no transport took it over
            raise
        return self._client

    def _channel(self, client: paramiko.SSHClient, hop: Target, after: Target) -> Any:
        """A ``direct-tcpip`` channel through ``hop`` to the next host's SSH port."""
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel("direct-tcpip", (after.host, after.port),
                                          ("127.0.0.1", 0), timeout=15)
        except (paramiko.SSHException, OSError) as exc:
            raise BurstError(f"the bastion {hop.label} cannot reach {after.host}:"
                             f"{after.port}: {exc}") from None

    def _login(self, target: Target, sock: Any, via: bool) -> paramiko.SSHClient:
        what = f"the bastion {target.label}" if via else target.label
        client = paramiko.SSHClient()
        for path in target.known_hosts:
            if os.path.exists(path):
                client.load_host_keys(path)
        client.set_missing_host_key_policy(
            SaveNewHostKey(target.known_hosts[0], self.saved_keys) if self.accept_new_host
            else paramiko.RejectPolicy())
        try:
            client.connect(target.host, sock=sock, **target.connect)
        except paramiko.BadHostKeyException:
            client.close()
            raise BurstError(f"{what}: the host key does NOT match known_hosts; "
                             "refusing to connect (a changed server, or someone in between)"
                             ) from None
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise BurstError(f"{what} is not in known_hosts "
                                 f"({', '.join(target.known_hosts)}): check its key and "
                                 "add it (ssh-keyscan), or pass --accept-new-host") from None
            raise BurstError(f"cannot connect to {what}: {exc}") from None
        except OSError as exc:
            client.close()
            raise BurstError(f"cannot connect to {what}: {exc}") from None
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        while self._hops:
            self._hops.pop().close()

    def drop(self) -> None:
        """Cut the TCP connection under the session (what a flaky link does); tests use it."""
        client = self._client
        transport = client.get_transport() if client else None
        if transport is not None and transport.sock is not None:
            transport.sock.shutdown(socket.SHUT_RDWR)

    def _exec(self, command: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        assert self._client is not None
        channel_in, out, err = self._client.exec_command(command, timeout=60)
        if stdin is not None:
            channel_in.write(stdin)
        channel_in.channel.shutdown_write()
        text, error = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return out.channel.recv_exit_status(), text, error

    def _checked(self, command: str, what: str, stdin: bytes | None = None) -> str:
        code, out, err = self._exec(command, stdin)
        if code != 0:
            last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
            raise BurstError(f"{self.target.label}: {what} failed (exit {code}): {last}")
        return out

    # -- the job ----------------------------------------------------------------------------

    def _gpus(self, report: Reporter) -> int:
        """The box's GPUs, as ``nvidia-smi`` lists them: 0 when it is missing or fails."""
        code, out, err = self._exec(GPU_QUERY)
        if code != 0:
            if code != 127:  # not "command not found": a driver that should be looked at
                last = (err.strip().splitlines() or out.strip().splitlines() or ["?"])[-1]
                report.say(f"{self.target.label}: nvidia-smi failed (exit {code}: {last}); "
                           "running as a CPU box")
            return 0
        return sum(1 for line in out.splitlines() if line.strip().isdigit())

    def _prepare(self, task: RenderedTask, world: Mapping[str, str] | None = None) -> str:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
        root = _remote_path(self.remote_root)
        out = self._checked(f"d={root}/{shlex.quote(task.name + '-' + stamp)} && "
                            'mkdir -p "$d" && cd "$d" && pwd', "creating the node directory")
        remote = out.strip().splitlines()[-1]
        envs = {**task.envs, **(world or {})}
        files = {"task.env": _env_file(envs), "setup.sh": task.setup, "run.sh": task.run,
                 "job.sh": _JOB.format()}
        assert self._client is not None
        with self._client.open_sftp() as sftp:
            for name, text in files.items():
                with sftp.open(f"{remote}/{name}", "w") as handle:
                    handle.write(text)
        return remote

    def _start(self, remote: str, secrets: Mapping[str, str]) -> int:
        command = (f"{shlex.quote(self.python)} -c {shlex.quote(_BOOTSTRAP)} "
                   f"{shlex.quote(remote)}")
        out = self._checked(command, "starting the job", json.dumps(dict(secrets)).encode())
        return int(out.strip().splitlines()[-1])

    def _follow(self, remote: str, pid: int, report: Reporter) -> int:
        """Tail the log until the job's exit code appears, reconnecting on a dropped link.
        The byte offset reached survives a drop, so nothing is shown twice or lost."""
        offset = [0]
        while True:
            try:
                self._tail(remote, pid, offset, report)
                code = self._exit_code(remote)
                if code is not None:
                    self._tail(remote, None, offset, report)  # anything left
                    return code
                if not self._running(pid):
                    raise BurstError(f"the job on {self.target.label} ({remote}) died without "
                                     "an exit code (killed, or the box rebooted)")
            except (OSError, EOFError, paramiko.SSHException) as exc:
                report.say(f"connection to {self.target.label} lost ({exc or type(exc).__name__});"
                           " the job keeps running there; reconnecting")
                self._reconnect(report)

    def _tail(self, remote: str, pid: int | None, offset: list[int], report: Reporter) -> None:
        """Stream the log from byte ``offset[0]``, advancing it as bytes arrive."""
        assert self._client is not None
        log = shlex.quote(f"{remote}/job.log")
        follow = f" -f --pid={pid}" if pid else ""
        _, out, _ = self._client.exec_command(f"tail -c +{offset[0] + 1}{follow} {log}")
        channel = out.channel
        while True:
            chunk = channel.recv(65536)
            if not chunk:
                break
            offset[0] += len(chunk)
            report.output(chunk.decode(errors="replace"))
        if channel.recv_exit_status() == -1 or not self._alive():
            raise EOFError("the channel closed without an exit status")

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    def _running(self, pid: int) -> bool:
        code, _, _ = self._exec(f"kill -0 {int(pid)} 2>/dev/null")
        return code == 0

    def _exit_code(self, remote: str) -> int | None:
        code, out, _ = self._exec(f"cat {shlex.quote(remote + '/exit_code')} 2>/dev/null")
        text = out.strip()
        if code != 0 or not text:
            return None
        return int(text)

    def _reconnect(self, report: Reporter) -> None:
        self.close()
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.5
        while True:
            try:
                self.connect()
                report.say(f"reconnected to {self.target.label}")
                return
            except BurstError:
                if time.monotonic() > deadline:
                    raise BurstError(f"{self.target.label} unreachable for "
                                     f"{self.reconnect_seconds:.0f}s; the job may still be "
                                     "running there (burst status shows its directory)"
                                     ) from None
                time.sleep(delay)
                delay = min(delay * 2, 10.0)


@dataclass(frozen=True)
class Job:
    """A job started on the box: its directory there, its pid, and a label for it."""

    directory: str
    pid: int
    where: str


class SaveNewHostKey(paramiko.MissingHostKeyPolicy):
    """Trust a host seen for the first time and append its key to ``path``, as ``ssh``'s
    ``StrictHostKeyChecking=accept-new`` does: later connections check against it."""

    def __init__(self, path: str, saved: list[str]) -> None:
        self.path, self.saved = path, saved

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        append_known_host(self.path, hostname, key)
        self.saved.append(f"{hostname} ({self.path})")


def append_known_host(path: str, hostname: str, key: paramiko.PKey) -> None:
    """One ``known_hosts`` line for ``hostname`` (``[host]:port`` off port 22), appended;
    the file (0600) and its folder (0700) are made if missing. Other lines stay as they are."""
    file = Path(path).expanduser()
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            newline = b""
            if size:
                handle.seek(size - 1)
                newline = b"" if handle.read(1) == b"\n" else b"\n"
            handle.write(newline + f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
    except OSError as exc:
        raise BurstError(f"cannot save the host key of {hostname} to {file}: {exc}") from None


def task_gpu_counts(task: RenderedTask) -> list[int]:
    """The GPUs per node of each candidate, in the task's order (``"L4:2"`` -> 2)."""
    counts = []
    for candidate in task.candidates:
        _, _, count = str(candidate.get("accelerators") or "").partition(":")
        counts.append(int(count) if count.isdigit() else 1)
    return counts


def processes_on_box(counts: list[int], gpus: int) -> int:
    """How many ranks the box runs: the first count the task asks for that the box has
    (candidates are in the planner's order), else every GPU it has; a CPU box runs the
    first count as CPU ranks."""
    wanted = counts or [1]
    if gpus <= 0:
        return wanted[0]
    return next((count for count in wanted if count <= gpus), gpus)


def box_env(counts: list[int], gpus: int) -> dict[str, str]:
    """The variables the task reads on a box with ``gpus`` GPUs: SkyPilot's for one node
    and the processes it runs, and ``CUDA_VISIBLE_DEVICES`` when it uses fewer GPUs than
    it has (so torchrun's ``LOCAL_RANK`` k is the k-th GPU used)."""
    processes = processes_on_box(counts, gpus)
    env = one_box_env(processes)
    if 0 < processes < gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(processes))
    return env


def _remote_path(path: str) -> str:
    """A shell word for ``path`` that still expands a leading ``~/`` on the box."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def _env_file(envs: Mapping[str, str]) -> str:
    """The task's envs (never secrets) as a file the job sources."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in envs.items())

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
``~/.ssh/known_hosts``); an unknown host is refused unless ``accept_new_host`` is set.

No SkyPilot runs on the box, so nothing sets the ``SKYPILOT_*`` variables the task's
torchrun line and ``burst node run``'s plan read. The launcher sets them itself, for one
node and one process per GPU it uses: it counts the box's GPUs (``nvidia-smi``; none on a
CPU box), takes the first GPU count the task asks for that the box has (all of them if
none fits), and hides the rest with ``CUDA_VISIBLE_DEVICES``. A CPU box runs as many ranks
as the task asks for (gloo). The world size planned and the processes started agree.
"""

from __future__ import annotations

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


@dataclass
class Target:
    """``ssh://[user@]host[:port]``, resolved through the SSH config like ``ssh`` does."""

    host: str
    connect: dict[str, Any]
    known_hosts: list[str]
    label: str

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
        config = _ssh_config(ssh_config).lookup(parsed.hostname)
        user = unquote(parsed.username or "") or config.get("user") or _local_user()
        known = known_hosts or config.get("userknownhostsfile") or "~/.ssh/known_hosts"
        connect = {"port": port or int(config.get("port", 22)), "username": user,
                   "key_filename": ([os.path.expanduser(identity)] if identity
                                    else config.get("identityfile")),
                   "timeout": 15, "banner_timeout": 15, "auth_timeout": 15}
        host = config.get("hostname", parsed.hostname)
        label = f"{user}@{parsed.hostname}:{connect['port']}"
        return cls(host, connect, [os.path.expanduser(p) for p in str(known).split()], label)


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

    # -- the protocol ---------------------------------------------------------------------

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        port = self.target.connect["port"]
        user = self.target.connect["username"]
        box = f"ssh -p {port} {user}@{self.target.host}"
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
        if task.num_nodes > 1:
            raise ConfigError(f"the ssh launcher runs on one box; the task asks for "
                              f"{task.num_nodes} nodes (use --nodes 1)")
        self._connect()
        gpus = self._gpus(report)
        world = box_env(task_gpu_counts(task), gpus)
        report.say(f"{self.target.label}: {gpus or 'no'} GPU(s); running "
                   f"{world['SKYPILOT_NUM_GPUS_PER_NODE']} process(es)"
                   + (f" on CUDA_VISIBLE_DEVICES={world['CUDA_VISIBLE_DEVICES']}"
                      if "CUDA_VISIBLE_DEVICES" in world else ""))
        remote = self._prepare(task, world)
        pid = self._start(remote, secrets)
        where = f"ssh:{self.target.label}:{remote}"
        report.event("ssh-job", where=where, pid=pid)
        report.say(f"started on {self.target.label} in {remote} (pid {pid}); streaming its log")
        code = self._follow(remote, pid, report)
        self.close()
        return LaunchResult(code, where, {"pid": pid, "dir": remote})

    # -- connection -----------------------------------------------------------------------

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        for path in self.target.known_hosts:
            if os.path.exists(path):
                client.load_host_keys(path)
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if self.accept_new_host
                                           else paramiko.RejectPolicy())
        try:
            client.connect(self.target.host, **self.target.connect)
        except paramiko.BadHostKeyException:
            raise BurstError(f"{self.target.label}: the host key does NOT match known_hosts; "
                             "refusing to connect (a changed server, or someone in between)"
                             ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise BurstError(f"{self.target.label} is not in known_hosts "
                                 f"({', '.join(self.target.known_hosts)}): check its key and "
                                 "add it (ssh-keyscan), or pass --accept-new-host") from None
            raise BurstError(f"cannot connect to {self.target.label}: {exc}") from None
        except OSError as exc:
            raise BurstError(f"cannot connect to {self.target.label}: {exc}") from None
        self._client = client
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

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
                self._connect()
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

"""The ``ssh`` launcher reaches a box the way ``ssh`` does, against real OpenSSH servers on
127.0.0.1: through a ``ProxyJump`` bastion (a second sshd, whose own log shows the
``direct-tcpip`` channel to the box), through a ``ProxyCommand``, and with a host key
accepted on first sight saved to known_hosts for the next connection to check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from burst.errors import BurstError
from burst.launch import Reporter
from burst.launch.ssh import SSHLauncher, Target
from burst.launch.task import parse
from tests.helpers.store_servers import SSHServer, free_port, stop, wait_until

TASK = """
name: burst-ssh-hops
resources:
  ordered:
    - {accelerators: "L4:1", infra: ssh/box, use_spot: false}
setup: |
  true
run: |
  echo "on the box"
  exit 4
"""

RELAY = """
import socket, sys, threading
marker, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(marker, "w").write(f"{host}:{port}")
conn = socket.create_connection((host, port))
def up():
    while data := sys.stdin.buffer.read1(65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := conn.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


@pytest.fixture(scope="module")
def bastion(sshd: SSHServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """A second OpenSSH server (the bastion), trusting the same client key, logging the
    channels it opens (``LogLevel DEBUG1``)."""
    base = tmp_path_factory.mktemp("bastion")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / "host_key")],
                   check=True)
    (base / "authorized_keys").write_text(Path(f"{sshd.client_key}.pub").read_text())
    port = free_port()
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host_key'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPidFile {base / 'sshd.pid'}\n"
        "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin prohibit-password\nAllowTcpForwarding yes\n"
        "LogLevel DEBUG1\n")
    host_pub = " ".join((base / "host_key.pub").read_text().split()[:2])
    log = base / "sshd.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(base / "sshd_config")],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: log.read_text().count("Server listening") > 0, "bastion sshd",
                   process, log=log)
        yield SSHServer(port, base / "sshd_config", base / "known_hosts", sshd.client_key,
                        host_pub, base)
    finally:
        stop(process)


def _quiet() -> tuple[list[str], Reporter]:
    chunks: list[str] = []
    return chunks, Reporter(say=lambda _m: None, output=chunks.append)


def test_a_job_runs_on_a_box_behind_a_proxyjump_bastion(sshd, bastion, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n"
                     f"[127.0.0.1]:{bastion.port} {bastion.host_pub}\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                      f"  IdentityFile {sshd.client_key}\n  ProxyJump jumper\n"
                      f"Host jumper\n  HostName 127.0.0.1\n  Port {bastion.port}\n"
                      f"  IdentityFile {sshd.client_key}\n")
    target = Target.parse("ssh://box", str(config), known_hosts=str(known))
    assert [hop.port for hop in target.jumps] == [bastion.port]
    chunks, report = _quiet()
    result = SSHLauncher(target, str(tmp_path / "remote")).launch(parse(TASK), {}, report)
    assert result.returncode == 4 and "on the box" in "".join(chunks)
    channels = [line for line in (bastion.root / "sshd.log").read_text().splitlines()
                if "direct_tcpip" in line and f"port {sshd.port}" in line]
    assert channels, "the bastion opened no channel to the box"


def test_a_proxycommand_from_the_ssh_config_carries_the_connection(sshd, tmp_path):
    relay, marker = tmp_path / "relay.py", tmp_path / "relayed"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                      f"  IdentityFile {sshd.client_key}\n"
                      f"  ProxyCommand {sys.executable} {relay} {marker} %h %p\n")
    target = Target.parse("ssh://box", str(config), known_hosts=str(sshd.known_hosts))
    launcher = SSHLauncher(target)
    try:
        _, out, _ = launcher.connect().exec_command("echo on the box")
        assert out.read() == b"on the box\n"
    finally:
        launcher.close()
    assert marker.read_text() == f"127.0.0.1:{sshd.port}"


def test_an_accepted_host_key_is_saved_to_known_hosts(sshd, tmp_path):
    known = tmp_path / "fresh" / ".ssh" / "known_hosts"  # neither file nor folder yet
    target = Target.parse(f"ssh://127.0.0.1:{sshd.port}", None, str(sshd.client_key), str(known))
    with pytest.raises(BurstError, match="not in known_hosts"):
        SSHLauncher(target).connect()
    accepting = SSHLauncher(target, accept_new_host=True)
    accepting.connect()
    accepting.close()
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n"
    assert oct(known.stat().st_mode & 0o777) == "0o600"
    checking = SSHLauncher(target)  # no longer accepting: the saved key is what it checks
    checking.connect()
    checking.close()


def test_a_saved_key_is_appended_after_the_lines_already_there(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(f"# my hosts\nother.example {sshd.host_pub}")  # no final newline
    target = Target.parse(f"ssh://127.0.0.1:{sshd.port}", None, str(sshd.client_key), str(known))
    launcher = SSHLauncher(target, accept_new_host=True)
    launcher.connect()
    launcher.close()
    assert known.read_text().splitlines() == [
        "# my hosts", f"other.example {sshd.host_pub}",
        f"[127.0.0.1]:{sshd.port} {sshd.host_pub}"]
    assert launcher.saved_keys == [f"[127.0.0.1]:{sshd.port} ({os.fspath(known)})"]

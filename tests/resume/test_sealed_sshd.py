"""The sealed SSH box of tests/helpers/sealed_sshd.py is what it claims: a login over a port relayed
into its network (:class:`burst.launch.sealed.Inbound`) onto a root that holds nothing of
this machine, whose network reaches only the ports it was given. Quick (a few seconds), so
a broken box shows here before the minutes-long end-to-end test through it."""

from __future__ import annotations

import http.server
import shlex
import sys
import threading

import paramiko
import pytest

from tests.conftest import ROOT
from tests.helpers.sealed_sshd import SealedBox, problem, sealed_sshd
from tests.helpers.store_servers import free_port


@pytest.fixture(scope="module")
def web() -> int:
    """A plain HTTP server on this machine's loopback: the box's one reachable port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()),
                                             http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def box(tmp_path_factory, web) -> SealedBox:
    why = problem()
    if why:
        pytest.skip(f"no sealed sshd here: {why}")
    with sealed_sshd(tmp_path_factory.mktemp("box"), [web]) as running:
        yield running


def on_box(box: SealedBox, command: str) -> tuple[int, str]:
    client = paramiko.SSHClient()
    client.load_host_keys(str(box.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect("127.0.0.1", port=box.port, username="root",
                   key_filename=str(box.client_key), timeout=15)
    try:
        _, out, err = client.exec_command(command, timeout=60)
        text = out.read().decode() + err.read().decode()
        return out.channel.recv_exit_status(), text
    finally:
        client.close()


def test_the_box_shows_none_of_this_machines_files(box):
    paths = [str(ROOT), sys.prefix, str(box.log), "/root/.pyenv"]  # the log: beside the box
    code, out = on_box(box, "for p in " + " ".join(map(shlex.quote, paths))
                       + '; do test -e "$p" && echo "visible $p"; done; touch /usr/x; true')
    assert code == 0
    assert "visible" not in out
    assert "Read-only file system" in out


def test_the_box_reaches_its_relayed_port_and_no_other(box, web):
    probe = ("import socket, urllib.request\n"
             f"print(urllib.request.urlopen('http://127.0.0.1:{web}/').status)\n"
             "for where in (('1.1.1.1', 80), ('127.0.0.1', {free})):\n"
             "    try:\n"
             "        socket.create_connection(where, 3)\n"
             "        print('reached', where)\n"
             "    except OSError as exc:\n"
             "        print('refused', where, exc.errno)\n").replace("{free}", str(free_port()))
    code, out = on_box(box, f"python3 -c {shlex.quote(probe)}")
    assert code == 0, out
    assert out.splitlines()[0] == "200"
    assert "reached" not in out


def test_a_login_points_every_package_index_at_a_dead_port(box):
    code, out = on_box(box, 'echo "$PIP_INDEX_URL $UV_INDEX_URL $HOME"')
    assert code == 0
    assert out.split() == ["http://127.0.0.1:9/simple/", "http://127.0.0.1:9/simple/", "/root"]

"""The sealed node: what a task run by the local stub can and cannot see.

Probe commands run through the real sealed runner (``unshare`` + ``pivot_root`` + a
network namespace) and report, from inside, what is there. The node must not see this
machine's source tree, local store, venv, HOME, pip configuration or wheels; no package
index may answer it, not even one on this machine's loopback; the store's server on
127.0.0.1 must answer; the system ``python3`` must run; ``/usr`` must stay read-only.
The stub tests run small hand-written tasks through :class:`LocalLauncher` sealed.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from burst.launch import Reporter, sealed
from burst.launch.local import Faults, LocalLauncher
from burst.launch.task import parse
from tests.conftest import ROOT
from tests.helpers.store_servers import BUCKET

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sealing needs root namespaces")


@pytest.fixture(scope="module", autouse=True)
def can_seal() -> None:
    assert sealed.problem() is None  # root on Debian: sealing must work, not fall back


def probe(tmp_path: Path, script: str, ports: tuple[int, ...] = (),
          binds: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh sealed node; stdout and stderr together."""
    node = sealed.Node(tmp_path / "node" / "root", tmp_path / "node" / "home", binds)
    env = sealed.environment({"PYTHONHASHSEED": "0"}, node.home)
    with sealed.Loopback(ports) as network:
        process = sealed.popen(node, script, env, network, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        out, _ = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, "")


def absent(tmp_path: Path, *paths: str | Path) -> list[str]:
    """Which of ``paths`` exist inside a sealed node (each must exist here)."""
    for path in paths:
        assert os.path.lexists(path), f"{path} must exist on this machine for the test"
    checks = " ".join(f"[ -e {p!s} ] && echo SEEN {p!s};" for p in paths)
    done = probe(tmp_path, checks + " true")
    assert done.returncode == 0, done.stdout
    return [line.split(" ", 1)[1] for line in done.stdout.splitlines()
            if line.startswith("SEEN ")]


def test_source_tree_is_not_visible(tmp_path):
    assert absent(tmp_path, ROOT, ROOT / "burst", ROOT / "pyproject.toml") == []


def test_local_store_directory_is_not_visible(tmp_path):
    store = tmp_path / "store"
    (store / "run" / "snapshots").mkdir(parents=True)
    assert absent(tmp_path, store, store / "run" / "snapshots") == []


def test_users_venv_and_interpreter_are_not_visible(tmp_path):
    assert absent(tmp_path, sys.prefix, sys.executable, os.path.realpath(sys.executable)) == []


def test_users_home_is_not_visible(tmp_path):
    home = os.path.expanduser("~")
    assert absent(tmp_path, home) == []


def test_pip_configuration_and_wheel_dirs_are_absent(tmp_path):
    here = [p for p in ("/etc/pip.conf", "/etc/xdg/pip", os.path.expanduser("~/.config/pip"),
                        "/opt/wheels", "/opt/pypi", "/opt/pypi-more") if os.path.lexists(p)]
    if not here:
        pytest.skip("this machine has no pip configuration or wheel directories to hide")
    assert absent(tmp_path, *here) == []
    done = probe(tmp_path, "python3 -m pip config list")
    files = [line for line in done.stdout.splitlines() if not line.startswith(":env:")]
    assert done.returncode == 0 and files == [], done.stdout  # no pip.conf anywhere
    assert "find-links" not in done.stdout and "extra-index" not in done.stdout


def test_globally_installed_python_packages_are_absent(tmp_path):
    done = probe(tmp_path, "ls -d /usr/local/lib/python3* 2>/dev/null; python3 -c "
                 "\"import sys; print('\\n'.join(p for p in sys.path if '/usr/local' in p))\"")
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout


@pytest.fixture
def index_here() -> Iterator[str]:
    """A package index on this machine's loopback (a local mirror): reachable from here."""
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body><a href='six-1.16.0-py2.py3-none-any.whl'>six</a></body>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def test_package_index_is_unreachable_even_on_this_machines_loopback(tmp_path, index_here):
    with urllib.request.urlopen(index_here + "six/", timeout=10) as answer:
        assert answer.status == 200  # this machine reaches it
    script = (f"python3 -c \"import urllib.request as u; u.urlopen('{index_here}six/', "
              "timeout=10)\" && echo REACHED; python3 -m pip download --no-deps -d /tmp/w six "
              f"&& echo DEFAULT-INDEX; python3 -m pip download --no-deps -d /tmp/w --index-url "
              f"{index_here} six && echo MIRROR; true")
    done = probe(tmp_path, script)
    assert "Connection refused" in done.stdout, done.stdout
    assert not {"REACHED", "DEFAULT-INDEX", "MIRROR"} & set(done.stdout.split()), done.stdout


def test_s3_server_on_loopback_is_reachable(tmp_path, moto_s3):
    moto_s3.client().put_object(Bucket=BUCKET, Key="probe/hello", Body=b"from the store")
    port = int(moto_s3.endpoint.rsplit(":", 1)[1])
    url = moto_s3.client().generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "probe/hello"}, ExpiresIn=600)
    done = probe(tmp_path, f"python3 -c \"import urllib.request as u; "
                           f"print(u.urlopen('{url}', timeout=10).read().decode())\"",
                 ports=(port,))
    assert done.returncode == 0 and done.stdout.strip() == "from the store", done.stdout


def test_system_python3_runs(tmp_path):
    done = probe(tmp_path, "command -v python3; python3 -c 'import sys, venv, ensurepip; "
                           "print(sys.executable, sys.prefix)'")
    assert done.returncode == 0, done.stdout
    assert done.stdout.split() == ["/usr/bin/python3", "/usr/bin/python3", "/usr"]


def test_writes_to_usr_fail(tmp_path):
    done = probe(tmp_path, "touch /usr/burst-probe 2>/dev/null || echo REFUSED; "
                           "mount -o remount,rw /usr 2>/dev/null || echo NO-REMOUNT")
    assert done.stdout.split() == ["REFUSED", "NO-REMOUNT"], done.stdout
    assert not Path("/usr/burst-probe").exists()


def test_home_is_the_fresh_node_directory(tmp_path):
    done = probe(tmp_path, 'ls -A "$HOME"; echo out > "$HOME/written"; pwd')
    assert done.returncode == 0 and done.stdout.split() == [str(tmp_path / "node" / "home")]
    assert (tmp_path / "node" / "home" / "written").read_text() == "out\n"


def test_file_store_given_to_the_node_is_writable(tmp_path):
    store = tmp_path / "store"
    done = probe(tmp_path, f"echo snapshot > {store}/blob", binds=(store,))
    assert done.returncode == 0, done.stdout
    assert (store / "blob").read_text() == "snapshot\n"


# -- the stub, sealed ------------------------------------------------------------------


TASK = """\
name: sealed-probe
num_nodes: 1
resources:
  job_recovery:
    strategy: EAGER_NEXT_REGION
    max_restarts_on_errors: 2
    recover_on_exit_codes: [87]
  ordered:
    - accelerators: "L4:1"
      use_spot: true
    - accelerators: "A100:1"
      use_spot: true
envs:
  BURST_RUN_ID: probe
  BURST_STORE: {url}
setup: |
  echo "$SKYPILOT_TASK_ID" >> {store}/task-ids
run: |
  echo "$HOME" >> {store}/homes
  [ -e {source} ] && echo "source visible" >> {store}/homes
  [ -e {store}/failed-once ] || {{ touch {store}/failed-once; exit 87; }}
"""


def stub_task(store: Path):
    store.mkdir(exist_ok=True)
    return parse(TASK.format(url=f"file://{store}", store=store, source=ROOT))


def quiet() -> Reporter:
    return Reporter(say=lambda _line: None, output=lambda _text: None)


def test_stub_recovers_onto_a_fresh_sealed_node_with_the_same_task_id(tmp_path):
    store = tmp_path / "store"
    launcher = LocalLauncher(tmp_path / "nodes", seal="require")
    result = launcher.launch(stub_task(store), {}, quiet())
    assert result.returncode == 0
    homes = (store / "homes").read_text().splitlines()
    assert len(homes) == 2 and len(set(homes)) == 2  # a fresh node each time, sealed
    assert len(set((store / "task-ids").read_text().splitlines())) == 1


def test_stub_falls_back_over_capacity_on_sealed_nodes(tmp_path):
    store = tmp_path / "store"
    report = quiet()
    launcher = LocalLauncher(tmp_path / "nodes", Faults(fail_first=1), seal="require")
    assert launcher.launch(stub_task(store), {}, report).returncode == 0
    assert "source visible" not in (store / "homes").read_text()


def test_stub_refuses_a_required_seal_for_this_machines_interpreter(tmp_path):
    launcher = LocalLauncher(tmp_path / "nodes", seal="require", node_python=sys.executable)
    with pytest.raises(sealed.SealError, match="this machine's interpreter"):
        launcher.launch(stub_task(tmp_path / "store"), {}, quiet())


def test_stub_says_a_node_is_not_sealed_when_it_runs_this_machines_interpreter(tmp_path):
    lines: list[str] = []
    launcher = LocalLauncher(tmp_path / "nodes", seal="auto", node_python=sys.executable)
    launcher.launch(stub_task(tmp_path / "store"), {}, Reporter(say=lines.append,
                                                                output=lambda _t: None))
    assert sum("node NOT sealed" in line for line in lines) == 1
    assert "source visible" in (tmp_path / "store" / "homes").read_text()

"""The torch build is confirmed on the index (or in the wheelhouse) before it is chosen.

The index is a real PEP 503 "simple" server on loopback (``http.server``), laid out like
PyTorch's ``/whl/<variant>/torch/`` pages: links with ``%2B`` for ``+`` and a hash fragment.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from burst.env import install, torchvariant, wheelprobe
from burst.env.lockfile import Lockfile, Package
from burst.env.torchvariant import Target
from burst.errors import ConfigError

LATER = "2.99.0"  # a release after the table's end
H100 = Target("cuda", "NVIDIA H100", (9, 0))


def wheel(version: str, variant: str, python: str = "310") -> str:
    local = version.replace("+", "%2B")
    return (f'<a href="../../files/torch-{local}%2B{variant}-cp{python}-cp{python}-'
            f'manylinux_2_28_x86_64.whl#sha256={"0" * 64}">torch-{version}+{variant}</a><br/>')


# variant -> the torch page's links (a variant absent here has no page: HTTP 404)
PAGES = {
    "cu128": wheel("2.11.0", "cu128") + wheel(LATER, "cu128", "311"),  # 3.11 only for 2.99
    "cu126": wheel("2.11.0", "cu126") + wheel(LATER, "cu126"),
    "cu130": wheel("2.11.0", "cu130"),
}


class SimpleIndex(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "whl" and parts[2] == "torch" and parts[1] in PAGES:
            body = f"<!DOCTYPE html><html><body>{PAGES[parts[1]]}</body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/{{variant}}"
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_release_after_the_table_gets_the_build_the_index_has_not_the_tables_guess(index):
    guess = torchvariant.choose(f"{LATER}+cpu", "cpu", H100)
    assert guess.variant == "cu128" and "assumed" in guess.reason
    probe = wheelprobe.index_probe(index, python="3.10")
    found = torchvariant.choose(f"{LATER}+cpu", "cpu", H100, probe)
    assert found.variant == "cu126" and "is published" in found.reason


def test_no_published_build_for_the_card_is_a_one_line_error(index):
    probe = wheelprobe.index_probe(index, python="3.10")
    blackwell = Target("cuda", "NVIDIA B200", (10, 0), (13, 0))  # needs cu128 or cu130
    with pytest.raises(ConfigError) as error:
        torchvariant.choose(f"{LATER}+cpu", "cpu", blackwell, probe)
    message = str(error.value)
    assert "\n" not in message and "no published" in message and "cu130" in message


def test_an_unreachable_index_leaves_the_tables_choice_marked_unconfirmed():
    probe = wheelprobe.index_probe(f"http://127.0.0.1:{closed_port()}/whl/{{variant}}",
                                   timeout=5)
    choice = torchvariant.choose(f"{LATER}+cpu", "cpu", H100, probe)
    assert choice.variant == "cu128" and "unconfirmed" in choice.reason


def test_the_wheelhouse_answers_before_the_index(index):
    held = [f"wheels/torch-{LATER}+cu128-cp310-cp310-manylinux_2_28_x86_64.whl"]
    probe = wheelprobe.either(wheelprobe.files_probe(held, "3.10"),
                              wheelprobe.index_probe(index, python="3.10"))
    assert torchvariant.choose(f"{LATER}+cpu", "cpu", H100, probe).variant == "cu128"


def test_a_release_in_the_table_keeps_its_recorded_build_once_confirmed(index):
    probe = wheelprobe.index_probe(index)
    choice = torchvariant.choose("2.11.0+cu128", "cu128", H100, probe)
    assert choice.variant == "cu128" and "is published" in choice.reason


def test_page_links_are_read_as_file_names():
    names = wheelprobe.page_files(PAGES["cu126"])
    assert f"torch-{LATER}+cu126-cp310-cp310-manylinux_2_28_x86_64.whl" in names
    assert wheelprobe.wheel_matches(names[0], "2.11.0+cpu", "cu126", "3.10")
    assert not wheelprobe.wheel_matches(names[0], "2.11.0", "cu126", "3.11")


def test_install_planning_probes_only_releases_after_the_table(index, tmp_path):
    assert wheelprobe.for_release("2.11.0+cu128", index) is None
    (tmp_path / f"torch-{LATER}+cu130-cp310-cp310-manylinux_2_28_x86_64.whl").write_bytes(b"")
    probe = wheelprobe.for_release(f"{LATER}+cpu", index, "3.10", tmp_path)
    driver13 = Target("cuda", "NVIDIA H100", (9, 0), (13, 0))
    assert torchvariant.choose(f"{LATER}+cpu", "cpu", driver13, probe).variant == "cu130"


def test_a_node_install_of_a_later_release_takes_the_build_its_index_has(index):
    lock = Lockfile(packages=[Package("torch", f"{LATER}+cpu")], python={"version": "3.10.12"},
                    torch={"version": f"{LATER}+cpu", "variant": "cpu"})
    driver13 = Target("cuda", "NVIDIA H100", (9, 0), (13, 0))
    plan = install.make_plan(lock, driver13, install.Options(
        venv=None, installer="pip", torch_index=index), {})
    assert plan.torch["variant"] == "cu126"  # the table would guess cu130; the index has cu126
    assert plan.requirements == [f"torch=={LATER}+cu126"]

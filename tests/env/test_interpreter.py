"""How a node gets the lock's Python, decided on the launching machine: the image's, a
standalone build from this machine's uv shipped through the store, or uv on the node."""

from __future__ import annotations

import pytest

from burst.contract import ENV_PYTHON_MIRROR
from burst.env import interpreter
from burst.env.lockfile import Lockfile
from burst.errors import ConfigError
from burst.store import MemoryStore


def lock(python: str) -> Lockfile:
    return Lockfile([], python={"version": python})


NO_UV = {"PATH": "/nonexistent", "UV_PYTHON_INSTALL_DIR": "/nonexistent"}


def test_a_310_lock_on_skypilots_default_images_uses_the_images_python():
    chosen = interpreter.route(lock("3.10.12"), [None, None], NO_UV)
    assert (chosen.kind, chosen.python) == ("image", "3.10")


def test_a_custom_image_is_not_assumed_to_have_it():
    chosen = interpreter.route(lock("3.10.12"), ["docker:me/img"], NO_UV)
    assert chosen.kind == "uv"


def test_without_a_standalone_here_the_node_installs_it_with_uv_and_says_from_where():
    chosen = interpreter.route(lock("3.12.3"), [None], NO_UV)
    assert chosen.kind == "uv" and "GitHub" in chosen.why and "uv python install 3.12" in chosen.why
    mirrored = interpreter.route(lock("3.12.3"), [None], {
        **NO_UV, interpreter.UV_MIRROR_ENV: "https://mirror.example.cn/pbs"})
    assert "from https://mirror.example.cn/pbs" in mirrored.why
    assert interpreter.forwarded({interpreter.UV_MIRROR_ENV: "https://m.example.cn"}) == {
        ENV_PYTHON_MIRROR: "https://m.example.cn"}


def test_a_standalone_from_this_machines_uv_is_shipped(uv_python_dir):
    chosen = interpreter.route(lock("3.11.7"), [None], {"UV_PYTHON_INSTALL_DIR":
                                                        str(uv_python_dir)})
    assert chosen.kind == "shipped" and chosen.standalone is not None
    assert chosen.standalone.minor == "3.11" and chosen.standalone.executable == "bin/python3.11"


def test_shipping_uploads_once_and_names_it_in_the_wheelhouse_index(uv_python_dir, tmp_path):
    store = MemoryStore("shipped")
    store.put("r/env/wheelhouse-x.json", b'{"format": 1, "wheels": []}')
    found = interpreter.find_standalone("3.11", {"UV_PYTHON_INSTALL_DIR": str(uv_python_dir)})
    said: list[str] = []
    entry = interpreter.ship(store, found, tmp_path, said.append)
    assert store.size(entry["key"]) == entry["size"] and len(said) == 1
    assert interpreter.ship(store, found, tmp_path, said.append) == entry and len(said) == 1
    interpreter.record(store, "r/env/wheelhouse-x.json", entry)
    assert b'"interpreter"' in store.get("r/env/wheelhouse-x.json")


def test_an_explicit_install_directory_that_is_not_one_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"is not a CPython 3\.11 install directory"):
        interpreter.find_standalone("3.11", {interpreter.EXPLICIT_ENV: str(tmp_path)})

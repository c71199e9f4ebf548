"""A local store never follows a symbolic link out of its root, for writes or reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from burst.errors import StoreError
from burst.store import LocalStore

KEY = "run/blobs/ad/ad00"


@pytest.fixture
def linked(tmp_path: Path) -> tuple[LocalStore, Path]:
    """A store whose ``run/blobs/ad`` is a link to a folder outside it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = LocalStore(tmp_path / "store")
    (store.root / "run" / "blobs").mkdir(parents=True)
    os.symlink(elsewhere, store.root / "run" / "blobs" / "ad")
    return store, elsewhere


@pytest.mark.parametrize("write", [
    lambda s: s.put(KEY, b"x"),
    lambda s: s.put_if_absent(KEY, b"x"),
    lambda s: s.put_filled(KEY, 1, lambda view: view.__setitem__(0, 1)),
    lambda s: s.append(KEY, b"x"),
    lambda s: s.delete(KEY),
], ids=["put", "put_if_absent", "put_filled", "append", "delete"])
def test_writes_through_a_linked_folder_are_refused(linked, write) -> None:
    store, elsewhere = linked
    (elsewhere / "ad00").write_bytes(b"theirs")
    with pytest.raises(StoreError, match="symbolic link"):
        write(store)
    assert [p.name for p in elsewhere.iterdir()] == ["ad00"]
    assert (elsewhere / "ad00").read_bytes() == b"theirs"


@pytest.mark.parametrize("read", [
    lambda s: s.get(KEY),
    lambda s: s.size(KEY),
    lambda s: s.read_into(KEY, memoryview(bytearray(6))),
    lambda s: s.view(KEY).__enter__(),
    lambda s: s.file_of(KEY),
], ids=["get", "size", "read_into", "view", "file_of"])
def test_reads_through_a_linked_folder_are_refused(linked, read) -> None:
    store, elsewhere = linked
    (elsewhere / "ad00").write_bytes(b"theirs")
    with pytest.raises(StoreError, match="symbolic link"):
        read(store)


def test_listings_do_not_enter_or_show_links(linked) -> None:
    store, elsewhere = linked
    (elsewhere / "ad00").write_bytes(b"theirs")
    os.symlink(elsewhere / "ad00", store.root / "run" / "file-link")
    store.put("run/blobs/ae/ae00", b"ours")
    assert store.list("run/") == ["run/blobs/ae/ae00"]
    with pytest.raises(StoreError, match="symbolic link"):
        store.list("run/blobs/ad/")


def test_links_that_stay_inside_the_store_still_work(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs/ae/ae00", b"ours")
    os.symlink(store.root / "run" / "blobs" / "ae", store.root / "run" / "blobs" / "ad")
    assert store.get("run/blobs/ad/ae00") == b"ours"


def test_a_read_of_a_file_linked_outside_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the store's")
    store = LocalStore(tmp_path / "store")
    store.put(KEY, b"x")
    os.unlink(store.root / KEY)
    os.symlink(secret, store.root / KEY)
    with pytest.raises(StoreError, match="leads outside"):
        store.get(KEY)


def test_a_run_folder_linked_outside_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = LocalStore(tmp_path / "store")
    store.root.mkdir()
    os.symlink(elsewhere, store.root / "run")
    with pytest.raises(StoreError, match="leads outside"):
        store.put(KEY, b"x")
    assert not list(elsewhere.iterdir())

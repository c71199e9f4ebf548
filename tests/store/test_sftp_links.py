"""An SFTP store never writes through a symbolic link out of its root (a real OpenSSH
server; its folder is on this machine, so the tests plant the links themselves)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from burst.errors import LinkOutOfStoreError
from burst.store import open_store

KEY = "run/blobs/ad/ad00"


@pytest.fixture
def store(sshd):
    store = open_store(sshd.url(), ssh_config=str(sshd.config))
    store.put("run/blobs/ae/ae00", b"ours")
    yield store
    store.close()


@pytest.fixture
def elsewhere(sshd, tmp_path: Path) -> Path:
    """A folder outside the store, on the server."""
    outside = sshd.root / f"outside-{tmp_path.name}"
    outside.mkdir()
    return outside


@pytest.mark.parametrize("write", [
    lambda s: s.put(KEY, b"x"),
    lambda s: s.put_if_absent(KEY, b"x"),
    lambda s: s.delete(KEY),
], ids=["put", "put_if_absent", "delete"])
def test_writes_through_a_folder_linked_outside_are_refused(store, elsewhere, write) -> None:
    (elsewhere / "ad00").write_bytes(b"theirs")
    os.symlink(elsewhere, Path(store.root) / "run" / "blobs" / "ad")
    with pytest.raises(LinkOutOfStoreError, match="leads outside") as caught:
        write(store)
    assert "\n" not in str(caught.value)
    assert [(p.name, p.read_bytes()) for p in elsewhere.iterdir()] == [("ad00", b"theirs")]


def test_folders_are_never_made_through_a_link_outside(store, elsewhere) -> None:
    os.symlink(elsewhere, Path(store.root) / "run" / "linked")
    with pytest.raises(LinkOutOfStoreError, match="leads outside"):
        store.put("run/linked/deeper/still/x", b"x")
    assert list(elsewhere.iterdir()) == []


def test_a_link_that_stays_inside_the_store_still_takes_writes(store) -> None:
    os.symlink("ae", Path(store.root) / "run" / "blobs" / "ad")
    store.put(KEY, b"through the link")
    assert (Path(store.root) / "run" / "blobs" / "ae" / "ad00").read_bytes() == \
        b"through the link"
    store.delete(KEY)
    assert not (Path(store.root) / "run" / "blobs" / "ae" / "ad00").exists()


def test_a_link_planted_at_the_key_is_replaced_not_written_through(store, elsewhere) -> None:
    (elsewhere / "target").write_bytes(b"theirs")
    os.symlink(elsewhere / "target", Path(store.root) / "run" / "blobs" / "ae" / "ae01")
    store.put("run/blobs/ae/ae01", b"ours")
    assert (elsewhere / "target").read_bytes() == b"theirs"
    assert store.get("run/blobs/ae/ae01") == b"ours"

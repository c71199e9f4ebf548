"""A local store's writes hold against a link swapped in while they run: they walk the key
from the root without the kernel following any link, so a folder replaced by a link to
somewhere else mid-write never sends a byte, a folder or a delete there."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from burst.errors import LinkOutOfStoreError, StoreError
from burst.store import LocalStore

RACES = 200


class Swapper:
    """Replaces ``folder`` with a link to ``outside`` and back, once per round, while a
    writer runs the same round (a barrier starts both)."""

    def __init__(self, folder: Path, outside: Path) -> None:
        self.folder, self.outside = folder, outside
        self.aside = folder.with_name(folder.name + ".aside")
        self.start = threading.Barrier(2, timeout=60)
        self.swapped = 0

    def round(self) -> None:
        try:
            self.start.wait()
        except threading.BrokenBarrierError:
            return  # the writer is done (or failed)
        try:
            os.rename(self.folder, self.aside)
        except FileNotFoundError:
            return
        try:
            os.symlink(self.outside, self.folder)
        except FileExistsError:  # the writer made the folder again in the gap
            shutil.rmtree(self.aside)
            return
        self.swapped += 1
        os.sched_yield()
        os.unlink(self.folder)
        try:
            os.rename(self.aside, self.folder)
        except OSError:  # the writer made it again meanwhile: keep the writer's
            shutil.rmtree(self.aside)


def test_a_link_swapped_in_during_writes_never_lets_one_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs/ab/ab00", b"first")
    swapper = Swapper(store.root / "run" / "blobs", outside)
    refused, failed = [], []

    def swap() -> None:
        try:
            for _ in range(RACES):
                swapper.round()
        except BaseException as exc:  # said by the test, not lost in a thread
            failed.append(exc)
            swapper.start.abort()

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        for race in range(RACES):
            swapper.start.wait()
            try:
                if race % 3 == 2:
                    store.delete("run/blobs/ab/ab00")
                else:
                    store.put(f"run/blobs/ab/ab{race:03d}", b"x" * 4096)
            except LinkOutOfStoreError as exc:
                refused.append(str(exc))
            except (FileNotFoundError, StoreError):
                pass  # the folder was away at that instant: a failed write, nothing leaked
    finally:
        swapper.start.abort()  # a writer that failed must not leave the swapper waiting
        thread.join(60)
    assert not thread.is_alive() and failed == []
    assert list(outside.iterdir()) == []  # no file, no folder, nothing renamed in
    assert swapper.swapped > 0
    assert all("\n" not in message and "leads outside" in message for message in refused)


def test_a_write_through_a_link_that_stays_inside_lands_where_it_points(tmp_path: Path
                                                                        ) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs/ae/ae00", b"ours")
    os.symlink(store.root / "run" / "blobs" / "ae", store.root / "run" / "blobs" / "ad")
    store.put("run/blobs/ad/ad01", b"through the link")
    assert (store.root / "run" / "blobs" / "ae" / "ad01").read_bytes() == b"through the link"
    assert (store.root / "run" / "blobs" / "ad").is_symlink()


def test_a_relative_link_that_stays_inside_still_works_for_writes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs/ae/ae00", b"ours")
    os.symlink("../blobs/ae", store.root / "run" / "blobs" / "ad")
    store.append("run/blobs/ad/log", b"line\n")
    store.delete("run/blobs/ad/ae00")
    assert sorted(p.name for p in (store.root / "run" / "blobs" / "ae").iterdir()) == ["log"]


def test_a_relative_link_leading_out_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs/ae/ae00", b"ours")
    os.symlink("../../../elsewhere", store.root / "run" / "blobs" / "ad")
    with pytest.raises(LinkOutOfStoreError, match="leads outside") as caught:
        store.put("run/blobs/ad/ad00", b"x")
    assert "\n" not in str(caught.value) and "run/blobs/ad" in str(caught.value)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_link_loop_inside_the_store_is_a_clear_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    (store.root / "run").mkdir(parents=True)
    os.symlink("b", store.root / "run" / "a")
    os.symlink("a", store.root / "run" / "b")
    with pytest.raises(StoreError, match="too many symbolic links"):
        store.put("run/a/x", b"x")


def test_a_file_where_a_folder_should_be_is_a_clear_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("run/blobs", b"a file")
    with pytest.raises(StoreError, match="is a file, not a folder"):
        store.put("run/blobs/ab/ab00", b"x")

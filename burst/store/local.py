"""A store on a local (or mounted) filesystem directory.

Atomicity comes from the classic recipe: write a temporary file in the same directory,
``fsync`` it, ``os.replace`` it into place, then ``fsync`` the directory so the rename
itself survives a power cut.

Everything is owner-only: directories burst creates are 0700 and files 0600, since a
snapshot holds the model and its data's statistics and a shared machine has other users.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from burst import killpoints
from burst.store.base import addressable, check_key, check_prefix


class LocalStore:
    """Objects are plain files under ``root``; keys are relative paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        _makedirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                killpoints.hit("local.put.written")
                f.flush()
                os.fsync(f.fileno())
            killpoints.hit("local.put.synced")
            os.replace(tmp, path)
            killpoints.hit("local.put.replaced")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)

    def put_filled(self, key: str, size: int, fill: Callable[[memoryview], None]) -> None:
        """Write ``size`` bytes that ``fill`` produces in place, atomically.

        A download lands straight in a memory-mapped temporary file (no second copy of a
        multi-GB blob in RAM); only if ``fill`` returns does it get synced and renamed in.
        """
        path = self._path(key)
        _makedirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.ftruncate(fd, size)
            if size:
                mapped = mmap.mmap(fd, size)
                try:
                    fill(memoryview(mapped))
                    mapped.flush()
                finally:
                    _close_map(mapped)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            killpoints.hit("local.filled.synced")
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)

    @contextlib.contextmanager
    def view(self, key: str) -> Iterator[memoryview]:
        """The object's bytes, memory-mapped read-only: uploads read it without a copy."""
        path = self._path(key)
        if not path.is_file():
            raise KeyError(key)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size:
                yield memoryview(b"")
                return
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
            try:
                yield memoryview(mapped)
            finally:
                _close_map(mapped)

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        path = self._path(key)
        _makedirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            killpoints.hit("local.put_if_absent.synced")
            try:
                os.link(tmp, path)  # link() fails if the target exists: an atomic create
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(path.parent)
        return True

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(key) from None

    def read_into(self, key: str, buffer: memoryview) -> int:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                filled = 0
                while filled < len(buffer):
                    n = f.readinto(buffer[filled:])
                    if not n:
                        break
                    filled += n
                return size
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(key) from None

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, prefix: str) -> list[str]:
        check_prefix(prefix)  # a run id of "../x" must not walk outside the store
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith("."):
                    continue  # temporary files of writes in progress
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return addressable(keys)

    def append(self, key: str, data: bytes) -> None:
        """Append in one O_APPEND write: lines from several processes never interleave."""
        path = self._path(key)
        _makedirs(path.parent)
        # O_NOFOLLOW: a symlink planted at the key is refused, never appended through
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()


def _makedirs(path: Path) -> None:
    """Create ``path`` and missing parents owner-only (``mkdir(parents=True)`` would make
    the parents world-readable: the mode applies only to the last directory)."""
    if path.is_dir():
        return
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it first
            directory.mkdir(mode=0o700)


def _close_map(mapped: mmap.mmap) -> None:
    """Unmap now, or (if a slice handed to a worker thread still lives) when it is freed."""
    with contextlib.suppress(BufferError):
        mapped.close()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""A store on a local (or mounted) filesystem directory.

Atomicity comes from the classic recipe: write a temporary file in the same directory,
``fsync`` it, ``os.replace`` it into place, then ``fsync`` the directory so the rename
itself survives a power cut.

Everything is owner-only: directories burst creates are 0700 and files 0600, since a
snapshot holds the model and its data's statistics and a shared machine has other users.

A write's temporary (``.<name>.<random>.tmp``) is locked (``flock``) by its writer from
creation to rename, so a sweep can tell a killed write's temporary (nobody holds its
lock: the kernel dropped it with the process) from a live one, however slow, and remove
only the former, at once (:meth:`LocalStore.sweep_temporaries`).

The store never follows a symbolic link out of its root: a link planted inside it
(``run/blobs/ad -> /elsewhere``) would otherwise send writes, and hand reads, outside it.

Writes (the temporary, the rename into place, the folders made on the way, appends and
deletes) never resolve a path and then use it: a link swapped in between the check and
the use would be followed. They walk the key one folder at a time from an open
descriptor of the root (``openat`` with ``O_NOFOLLOW | O_DIRECTORY``), and act on the
last folder's descriptor (``dir_fd=``), so no link is ever followed by the kernel. A link
met on the way is read and resolved by the walk itself, inside the root (a link that
stays in the store still works; one that leads out raises
:class:`~burst.errors.LinkOutOfStoreError`), and the file itself is replaced or unlinked,
never followed. Nothing of the walk is cached: each write re-walks, at one ``openat`` per
folder (a blob's key has three), which replaces the ``lstat`` per folder and the
``open`` of the folder to ``fsync`` that a write cost before.

Reads check the resolved path before they use it (a link swapped in meanwhile can show
a read a file outside, never write one); listings do not enter or show links at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from burst import killpoints
from burst.errors import LinkOutOfStoreError, StoreError
from burst.store.base import Pace, addressable, check_key, check_prefix, check_range

FILE_CHUNK = 4 << 20  # put_file copies this much at a time
MAX_LINKS = 40  # links one walk resolves before giving up (the kernel's own limit)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LocalStore:
    """Objects are plain files under ``root``; keys are relative paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = self.root.as_uri()
        self._root = str(self.root)
        self._cut = len(str(self.root).rstrip("/")) + 1  # a listed path less this is its key

    def _path(self, key: str) -> Path:
        """Where ``key`` is read from: the path, every link in it resolved, in the root."""
        path = self.root / check_key(key)
        self._contain(path, key)
        return path

    @contextlib.contextmanager
    def _folder(self, key: str, *, create: bool = True) -> Iterator[tuple[int, str]]:
        """The open folder that ``key``'s file lies in, and the file's name: walked from
        the root without the kernel following any link (see the module doc), its missing
        folders made owner-only when ``create`` (else FileNotFoundError)."""
        *folders, name = check_key(key).split("/")

        def refuse(where: str, target: str) -> LinkOutOfStoreError:
            return LinkOutOfStoreError(f"{self.url}: refusing {key!r}: a symbolic link in the "
                                       f"store leads outside it ({where} -> {target})")

        folder = _walk(self._root, folders, create, refuse)
        try:
            yield folder, name
        finally:
            os.close(folder)

    def _contain(self, path: Path, key: str) -> None:
        """Refuse ``path`` if a link in it leads outside the root. Every write and read
        asks (a persist every step asks dozens of times), so the common case, no link at
        all below the root, costs one ``lstat`` per folder; a link found is resolved."""
        if not _link_below(str(self.root), str(path)):
            return
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.root]) != str(self.root):
            raise LinkOutOfStoreError(f"{self.url}: refusing {key!r}: a symbolic link in the "
                                      f"store leads outside it (to {real})")

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self._folder(key) as (folder, name):
            with _temporary(folder, name) as (fd, tmp):
                _write_all(fd, data)
                killpoints.hit("local.put.written")
                os.fsync(fd)
                killpoints.hit("local.put.synced")
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                killpoints.hit("local.put.replaced")
            os.fsync(folder)  # the rename itself survives a power cut

    def put_filled(self, key: str, size: int, fill: Callable[[memoryview], None]) -> None:
        """Write ``size`` bytes that ``fill`` produces in place, atomically.

        A download lands straight in a memory-mapped temporary file (no second copy of a
        multi-GB blob in RAM); only if ``fill`` returns does it get synced and renamed in.
        """
        def through_a_map(fd: int) -> None:
            if not size:
                return
            mapped = mmap.mmap(fd, size)
            try:
                fill(memoryview(mapped))
                mapped.flush()
            finally:
                _close_map(mapped)

        self.put_written(key, size, through_a_map)

    def put_written(self, key: str, size: int, fill: Callable[[int], None]) -> None:
        """Like :meth:`put_filled`, but ``fill`` gets the temporary file's descriptor, to
        ``os.pwrite`` into (from any thread) and ``os.pread`` back.

        Writing a fresh file through a memory map costs a page fault and a block
        allocation per 4 KiB page; ``pwrite`` costs about half the CPU (a parallel
        download on a busy machine is CPU-bound). Synced and renamed in only if ``fill``
        returns."""
        with self._folder(key) as (folder, name):
            with _temporary(folder, name) as (fd, tmp):
                os.ftruncate(fd, size)
                fill(fd)
                os.fsync(fd)
                killpoints.hit("local.filled.synced")
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            os.fsync(folder)

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Copy the file at ``path`` in, a chunk at a time, through the atomic write path
        (:meth:`put_written`: a temporary, synced, renamed in)."""
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size

            def copy(fd: int) -> None:
                for offset in range(0, size, FILE_CHUNK):
                    if pace is not None:
                        pace(min(FILE_CHUNK, size - offset))
                    chunk = source.read(FILE_CHUNK)
                    if not chunk:
                        raise StoreError(f"{path} shrank while it was copied into {self.url}")
                    _write_all(fd, chunk)

            self.put_written(key, size, copy)

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

    def file_of(self, key: str) -> tuple[str, int]:
        """The object's file and size, for a reader that maps it (a restore's tensors,
        :func:`burst.snapshot.tensors.read_blob`) rather than reading it. Objects are
        replaced (``os.replace``), never rewritten, so a mapped file never changes under
        its map, and an unlinked one lives on while mapped. KeyError if absent."""
        path = self._path(key)
        try:
            status = os.stat(path)
        except FileNotFoundError:
            raise KeyError(key) from None
        if not stat.S_ISREG(status.st_mode):
            raise KeyError(key)
        return str(path), status.st_size

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        with self._folder(key) as (folder, name):
            with _temporary(folder, name) as (fd, tmp):
                _write_all(fd, data)
                os.fsync(fd)
                killpoints.hit("local.put_if_absent.synced")
                try:  # link() fails if the target exists: an atomic create
                    os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                except FileExistsError:
                    return False
            os.fsync(folder)
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

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``pread`` from the file: no seek, so threads share nothing but the path."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(key) from None
        try:
            check_range(self.url, key, start, length, os.fstat(fd).st_size)
            pieces, filled = [], 0
            while filled < length:  # one read a GiB: Linux returns at most ~2 GiB a call
                piece = os.pread(fd, min(length - filled, 1 << 30), start + filled)
                if not piece:
                    raise StoreError(f"{self.url}: {key} shrank while being read")
                pieces.append(piece)
                filled += len(piece)
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        finally:
            os.close(fd)

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
        self._contain(base, prefix)
        keys, cut = [], self._cut
        try:
            for entry in _files(base):
                if entry.name.startswith("."):
                    continue  # temporary files of writes in progress
                key = entry.path[cut:]
                if key.startswith(prefix):
                    keys.append(key)
        except PermissionError as exc:  # said, not taken for "nothing there"
            raise StoreError(f"{self.url}: permission denied reading {exc.filename}") from None
        return addressable(keys)

    def sweep_temporaries(self, prefix: str, older_than: float, *,
                          protected: Collection[str] = (), dry_run: bool = False
                          ) -> tuple[int, int]:
        """Delete the temporaries under ``prefix`` that no live write holds; return how
        many, and their bytes (``dry_run``: count them, delete nothing).

        A write killed between creating its temporary and renaming it into place (a
        persist, an upload marker) leaves ``.<name>.<random>.tmp`` behind, invisible to
        listings and so to GC. Its writer's lock died with it, so a temporary whose lock
        can be taken is removed at once (under that lock); one whose lock is held belongs
        to a live write, never touched. Where the filesystem has no locks, a temporary
        counts as dead once nothing has written it for ``older_than`` seconds, unless it
        is the temporary of a key in ``protected`` (one an upload marker names).
        """
        check_prefix(prefix)
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return 0, 0
        self._contain(base, prefix)
        cutoff, count, size, cut = time.time() - older_than, 0, 0, self._cut
        for entry in _files(base):
            key = entry.path[cut:]
            if entry.name.startswith(".") and entry.name.endswith(".tmp") \
                    and key.startswith(prefix):
                try:  # the folder walked again, never followed: a delete stays inside
                    with self._folder(key, create=False) as (folder, name):
                        target = f"{key.rsplit('/', 1)[0]}/{name[1:].rsplit('.', 2)[0]}"
                        gone = _remove_if_dead(folder, name, cutoff, target in protected,
                                               dry_run)
                except (FileNotFoundError, LinkOutOfStoreError):
                    continue  # moved meanwhile, or behind a link out: not this store's
                if gone is not None:
                    count, size = count + 1, size + gone
        return count, size

    def append(self, key: str, data: bytes) -> None:
        """Append in one O_APPEND write: lines from several processes never interleave."""
        with self._folder(key) as (folder, name):
            # O_NOFOLLOW: a symlink planted at the key is refused, never appended through
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        """Unlink the file (a link at the key itself goes, never what it points to)."""
        with contextlib.suppress(FileNotFoundError), \
                self._folder(key, create=False) as (folder, name):
            os.unlink(name, dir_fd=folder)


def _walk(root: str, folders: list[str], create: bool,
          refuse: Callable[[str, str], Exception]) -> int:
    """An open descriptor of the folder ``root/folders...``, reached one ``openat`` at a
    time with ``O_NOFOLLOW``, so the kernel never follows a link, whenever it was
    swapped in. A link met on the way is read and walked again from the root by this
    walk; one leading outside ``root`` gets ``refuse(link, target)`` raised. Missing
    folders are made (0700) when ``create``, else FileNotFoundError."""
    pending = folders[::-1]  # a stack: the next folder to enter is last
    walked: list[str] = []  # the folders entered below the root: none of them is a link
    links, via = 0, ("", "")  # the last link met, and its target
    fd = _open_root(root, create)
    try:
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":  # only ever from a link's target
                if not walked:
                    raise refuse(*via)
                pending.extend(reversed(walked[:-1]))
            else:
                try:
                    child = os.open(name, _FOLDER, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):  # another writer made it
                        os.mkdir(name, 0o700, dir_fd=fd)
                    pending.append(name)  # enter it (or what took its place) next
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    links += 1
                    if links > MAX_LINKS:
                        raise StoreError(f"{root}: too many symbolic links on the way to "
                                         f"{'/'.join(folders)}") from None
                    via, folders_now = _through_link(root, walked, name, fd, refuse)
                    pending.extend(reversed(folders_now))
                else:
                    os.close(fd)
                    fd = child
                    walked.append(name)
                    continue
            os.close(fd)  # a link or "..": walked again from the root
            fd, walked = _open_root(root, create), []
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_root(root: str, create: bool) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise
    _makedirs(Path(root))
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _through_link(root: str, walked: list[str], name: str, fd: int,
                  refuse: Callable[[str, str], Exception]
                  ) -> tuple[tuple[str, str], list[str]]:
    """The link ``walked/name`` (which ``fd``, the folder ``walked``, holds as a link or
    a file) and its target, and the folders to walk from the root in its place: its
    target's, when that lies inside the root; ``name`` again when it vanished."""
    here = "/".join([root, *walked, name])
    try:
        target = os.readlink(name, dir_fd=fd)
    except FileNotFoundError:
        return (here, ""), [*walked, name]  # swapped away meanwhile: look again
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link: a file where a folder should be
            raise StoreError(f"{here} is a file, not a folder: cannot write below it"
                             ) from None
        raise
    if not target.startswith("/"):
        return (here, target), [*walked, *target.split("/")]  # ".." leaves real folders
    for spelled in (target, os.path.realpath(target)):  # a path to the root through links
        if spelled == root or spelled.startswith(root + "/"):
            return (here, target), spelled[len(root):].split("/")
    raise refuse(here, target)


@contextlib.contextmanager
def _temporary(folder: int, name: str) -> Iterator[tuple[int, str]]:
    """A new temporary beside ``name`` in the open ``folder`` (descriptor and name),
    locked while the write lives and removed at the end unless renamed or linked into
    place by then.

    A sweep may take a dead-looking temporary between its creation and its lock: the
    writer then finds it unlinked (or the lock taken) and makes another."""
    while True:
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=folder)
        except FileExistsError:
            continue  # the same random name twice: draw another
        if _lock(fd, wait=False) is not False and os.fstat(fd).st_nlink:
            break
        os.close(fd)
    try:
        yield fd, tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)  # renamed away already, unless the write failed
        os.close(fd)  # the lock goes with the last descriptor


def _lock(fd: int, wait: bool) -> bool | None:
    """Take ``fd``'s exclusive lock: True, False when another holds it, None when this
    filesystem has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            return None
        raise
    return True


def _remove_if_dead(folder: int, name: str, cutoff: float, protected: bool, dry_run: bool
                    ) -> int | None:
    """Remove the temporary ``name`` of the open ``folder`` unless a live write holds
    it (or, without locks, it is recent or ``protected``); its size if removed (or,
    ``dry_run``, if it would be), else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except OSError:
        return None  # renamed meanwhile, or not a plain file: not ours to judge
    try:
        held = _lock(fd, wait=False)
        status = os.fstat(fd)
        if held is False or (held is None and (status.st_mtime >= cutoff or protected)):
            return None
        if dry_run:
            return status.st_size
        try:
            if os.stat(name, dir_fd=folder, follow_symlinks=False).st_ino != status.st_ino:
                return None  # another file took the name meanwhile
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            return None
        return status.st_size
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _files(base: Path) -> Iterator[os.DirEntry[str]]:
    """Every regular file under ``base``; symbolic links (to files or folders) are never
    listed or entered, so a listing cannot lead outside the store. Entries, not paths:
    a prune lists the run every persist, and building a ``Path`` per file cost more
    than reading the folders."""
    pending = [str(base)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as scan:
                entries = list(scan)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while walking
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                yield entry


def _link_below(root: str, path: str) -> bool:
    """Whether a folder or file on the way from ``root`` down to ``path`` (which lies
    under it, keys being checked) is a symbolic link. Where the way ends (a folder not
    made yet), nothing further can be a link."""
    current = root
    for part in path[len(root):].split("/"):
        if not part:
            continue
        current = f"{current}/{part}"
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False
    return False


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


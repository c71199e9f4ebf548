"""Which files the training process reads: a Python audit hook on ``open``.

A run's data set rarely lives in its code tree (``~/data/wikitext``, a memmapped token
file, pretrained weights in a hub cache), and nothing in the script says so in a form
burst could parse. So burst watches: :func:`start` adds an audit hook (``sys.addaudithook``,
event ``open``) that keeps each path opened for reading, once. The hook sits on every
``open`` of the process, so it does as little as it can: an event-name compare, a set
lookup for a path seen before, and for a new one a look at the thread's name (burst's own
threads, named ``burst-*``, read the code tree and the environment: not inputs) and an
append to a list. No I/O, no
filtering: which of the paths are inputs (outside the code tree, the Python environment
and the system) is decided at freeze time by :mod:`burst.inputs.selection`, off the hot
path. An audit hook cannot be removed, so it is added once per process; it records while
any run wants it (:func:`start` and :func:`stop` count them) and is muted after.

One process may hold several runs, one after another (a notebook) or side by side: each
run takes a :func:`mark` when it starts and :func:`collect` gives it only what was read
since, so a run never ships what an earlier one read (a mark forgets which paths were
already shown, so a file both runs read is recorded for the second one too).

What the hook misses is picked up at :func:`collect` time from ``/proc/self/maps`` (a
token file memmapped before the hook was added) and ``/proc/self/fd`` (files still
open). DataLoader workers forked from the process inherit the hook; each writes the paths
it found to a small file in :func:`start`'s directory from a daemon thread (never from the
hook), and :func:`collect` reads them. Workers started with ``spawn`` are not watched:
declare what they read (``burst.Run(inputs=...)``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

_SEEN: set[object] = set()  # every path the hook was shown, as given (str, bytes, fd ...)
_NEW: list[str] = []  # absolute paths found since the last drain (list.append is atomic)
_FOUND: dict[str, int] = {}  # every path found so far -> when it was last found (a counter)
_REPORTS: dict[str, int] = {}  # a forked worker's report file -> how much of it was read
_STATE: dict[str, object] = {"installed": False, "on": False, "dir": None, "child": False}
_COUNTS = {"users": 0, "found": 0}  # runs recording now; paths found so far (the clock)
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
FLUSH_SECONDS = 0.2  # how often a forked worker writes what it found
BURST_THREADS = "burst-"  # the prefix of every thread burst starts (burst-freeze, ...)


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _STATE["on"]:
        return
    try:
        path = args[0]
        if path in _SEEN:
            return
        if threading.current_thread().name.startswith(BURST_THREADS):
            return  # burst's own reads (the code archive, the lockfile): not the run's
        _SEEN.add(path)
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (not mode and flags & _WRITING):
            return  # written, not read: an output
        if isinstance(path, int):
            return
        name = os.fsdecode(os.fspath(path))
        _NEW.append(name if name.startswith("/") else os.path.join(os.getcwd(), name))
    except Exception:  # an audit hook that raises fails the user's open()
        return


def start() -> Path:
    """Record from now on, for one more run; the directory forked workers report into."""
    if not _STATE["installed"]:
        _STATE["dir"] = tempfile.mkdtemp(prefix="burst-inputs-")
        atexit.register(_remove_dir, str(_STATE["dir"]), os.getpid())
        sys.addaudithook(_hook)
        os.register_at_fork(after_in_child=_in_child)
        _STATE["installed"] = True
    _COUNTS["users"] += 1
    _STATE["on"] = True
    return Path(str(_STATE["dir"]))


def _remove_dir(directory: str, owner: int) -> None:
    """At the recording process's exit: its workers' reports are read by then, and a
    folder left per run would pile up in the user's temporary folder. Not in a forked
    child, whose exit must not take the folder from the process still recording."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


def stop() -> None:
    """One run is done recording; with none left the hook is muted (Python cannot remove
    it), so a finished run's process does not go on collecting paths for nobody."""
    _COUNTS["users"] = max(0, _COUNTS["users"] - 1)
    _STATE["on"] = _COUNTS["users"] > 0


def mark() -> int:
    """Where a run starts: :func:`collect` with this mark gives what was read after it."""
    _gather()
    _SEEN.clear()  # shown again from now on: the new run reads them too
    return _COUNTS["found"]


def recording() -> bool:
    return bool(_STATE["on"])


def _in_child() -> None:
    """A forked worker: write what it finds to its own file, from a thread."""
    if not _STATE["on"]:
        return
    _STATE["child"] = True
    _NEW.clear()
    threading.Thread(target=_flush_forever, name="burst-inputs", daemon=True).start()


def _flush_forever() -> None:
    stopped = threading.Event()
    target = Path(str(_STATE["dir"])) / f"opened-{os.getpid()}.txt"
    while not stopped.wait(FLUSH_SECONDS):
        found = _drain()
        if found:
            try:
                with open(target, "a", encoding="utf-8", errors="surrogateescape") as out:
                    out.write("".join(f"{p}\n" for p in found))
            except OSError:
                return


def _drain() -> list[str]:
    count = len(_NEW)
    found = _NEW[:count]
    del _NEW[:count]
    return found


def collect(since: int = 0) -> list[str]:
    """Every absolute path read since the :func:`mark` ``since`` by this process and its
    forked workers, and those its memory maps and open files hold now (sorted; not yet
    filtered)."""
    _gather()
    found = {path for path, when in _FOUND.items() if when > since}
    found.update(mapped_files())
    found.update(open_files())
    return sorted(p for p in found if p.startswith("/"))


def _gather() -> None:
    """Take in what the hook and the forked workers found since the last gathering."""
    _found(_drain())
    folder = _STATE["dir"]
    if not folder:
        return
    for report in Path(str(folder)).glob("opened-*.txt"):
        try:
            with open(report, "rb") as lines:
                lines.seek(_REPORTS.get(str(report), 0))
                new = lines.read()
        except OSError:
            continue
        whole = new[:new.rfind(b"\n") + 1]  # a line still being written waits for the next
        _REPORTS[str(report)] = _REPORTS.get(str(report), 0) + len(whole)
        _found(os.fsdecode(line) for line in whole.splitlines())


def _found(paths: Iterable[str]) -> None:
    for path in paths:
        _COUNTS["found"] += 1
        _FOUND[path] = _COUNTS["found"]


def mapped_files(maps: str = "/proc/self/maps") -> set[str]:
    """Files mapped into memory (a ``np.memmap`` token file opened before :func:`start`)."""
    try:
        lines = Path(maps).read_text(errors="surrogateescape").splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith(
                " (deleted)") and "r" in fields[1] and "w" not in fields[1]:
            found.add(fields[5])
    return found


def open_files(fds: str = "/proc/self/fd") -> set[str]:
    """Regular files this process holds open for reading now."""
    found: set[str] = set()
    try:
        entries = os.listdir(fds)
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(os.path.join(fds, entry))
            flags = _fd_flags(entry)
        except OSError:
            continue
        if target.startswith("/") and flags is not None and not flags & (os.O_WRONLY | os.O_RDWR):
            found.add(target)
    return found


def _fd_flags(entry: str) -> int | None:
    try:
        for line in Path(f"/proc/self/fdinfo/{entry}").read_text().splitlines():
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        return None
    return None


def reset() -> None:
    """Forget what was found and who records (tests; the hook stays installed, muted)."""
    _COUNTS["users"], _STATE["on"] = 0, False
    _SEEN.clear()
    _NEW.clear()
    _FOUND.clear()
    _REPORTS.clear()
    _COUNTS["found"] = 0
    folder = _STATE["dir"]
    if folder:
        for report in Path(str(folder)).glob("opened-*.txt"):
            report.unlink(missing_ok=True)

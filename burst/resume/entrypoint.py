"""The entry point travels with the code: this machine's paths become paths in the archive.

A run's command names files as this machine sees them (the agent records
``python /home/me/proj/scripts/train.py``). The node has none of those paths: it restores
the code archive under ``$BURST_NODE_DIR/code`` and runs from ``code/<cwd>``, the working
directory the archive recorded relative to its root. So every absolute argument under the
archived tree becomes relative to that directory, and an entry-point script the archive
does not hold is refused before anything launches, with a reason, rather than found
missing on a node that was paid for.

The archive's root on this machine is not stored (paths of this machine stay here); it is
found from the command itself: the ancestor of an absolute argument under which that path
is a file of the archive with the same content (preferring one where the recorded ``cwd``
exists). Content decides because a name alone can mislead: ``/elsewhere/train.py`` is not
the archive's ``train.py``, and a script edited since the freeze is not what the node would
run (it runs the archived copy), so both are refused rather than silently swapped.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from burst.errors import ConfigError

# interpreter options that take a value (``python -W error train.py``)
_VALUE_OPTIONS = {"-W", "-X", "--check-hash-based-pycs"}
Exists = Callable[[str], bool]  # is this a directory on this machine
Same = Callable[[str, str], bool]  # is this machine's file the archive's member (bytes)
NODE_PYTHON = "python"  # what the node runs an interpreter path of this machine as
_INTERPRETER = re.compile(r"python(\d+(\.\d+)*)?")  # python, python3, python3.11
_ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")  # beside bin/: a venv, a conda env


@dataclass(frozen=True)
class Relocated:
    """The command as the node runs it, from ``code/<workdir>``."""

    command: list[str]
    workdir: str = "."
    warnings: list[str] = field(default_factory=list)


def is_interpreter(program: str) -> bool:
    """``program`` (a bare name or a path) names a Python interpreter."""
    return _INTERPRETER.fullmatch(PurePosixPath(program).name) is not None


def in_environment(program: str) -> bool:
    """``program`` lies in the ``bin`` of a Python environment on this machine."""
    path = PurePosixPath(program)
    return path.parent.name == "bin" and any(
        os.path.exists(os.path.join(str(path.parent.parent), marker))
        for marker in _ENVIRONMENT_MARKERS)


def node_program(command: Sequence[str]) -> list[str]:
    """``command`` with its program as the node finds it: an interpreter path of this
    machine becomes ``python``, a program of a local environment's ``bin`` its bare name
    (see the module's docstring); anything else is kept."""
    args = list(command)
    if not args or "/" not in args[0]:
        return args
    if is_interpreter(args[0]):
        args[0] = NODE_PYTHON
    elif in_environment(args[0]):
        args[0] = PurePosixPath(args[0]).name
    return args


def on_node(command: Sequence[str], python: str) -> list[str]:
    """On the node: a leading bare interpreter name (``python``, ``python3.11``) is its
    ``python``, by path, whatever else its PATH holds (``/usr/bin`` may have no
    ``python``, or another one)."""
    args = list(command)
    if args and "/" not in args[0] and is_interpreter(args[0]):
        args[0] = python
    return args


def script_index(command: Sequence[str]) -> int | None:
    """Where the entry-point script is in ``command``: after ``python`` and its options, or
    the command itself when it is a path; None for ``python -m``/``-c`` and programs."""
    if not command:
        return None
    if PurePosixPath(command[0]).name.startswith("python"):
        index = 1
        while index < len(command) and command[index].startswith("-"):
            if command[index] in ("-m", "-c") or command[index].startswith(("-m", "-c")):
                return None
            index += 2 if command[index] in _VALUE_OPTIONS else 1
        return index if index < len(command) else None
    return 0 if "/" in command[0] else None


def clean_workdir(cwd: object) -> str:
    """The archive's recorded working directory, as a safe relative path."""
    text = posixpath.normpath(str(cwd or "."))
    if text.startswith(("/", "..")):
        raise ConfigError(f"the code archive records an unusable working directory {cwd!r}")
    return text


def named_roots(path: str, members: set[str]) -> list[PurePosixPath]:
    """The ancestors of ``path`` under which the archive holds that relative path (a file,
    or a directory of files), nearest first."""
    target = PurePosixPath(posixpath.normpath(path))
    found = []
    for root in target.parents:
        rel = target.relative_to(root).as_posix()
        if rel in members or any(m.startswith(rel + "/") for m in members):
            found.append(root)
    return found


def find_root(path: str, members: set[str], workdir: str, exists: Exists | None = None,
              same: Same | None = None) -> PurePosixPath | None:
    """The ancestor of ``path`` under which ``path`` is that file of the archive."""
    target = PurePosixPath(posixpath.normpath(path))
    found = [r for r in named_roots(path, members)
             if same is None or same(str(target), target.relative_to(r).as_posix())]
    if not found:
        return None
    with_cwd = [r for r in found if exists is not None and exists(str(r / workdir))]
    return (with_cwd or found)[0]


def relocate(command: Sequence[str], members: set[str], cwd: object,
             exists: Exists | None = None, same: Same | None = None) -> Relocated:
    """``command`` with its program as the node finds it (:func:`node_program`) and this
    machine's paths under the archive made relative to ``code/<cwd>``; refuses an
    entry-point script the archive does not hold."""
    workdir = clean_workdir(cwd)
    command = node_program(command)
    args = list(command)
    script = script_index(args)
    absolute = [a.partition("=")[2] if a.startswith("-") else a for a in args]
    candidates = ([absolute[script]] if script is not None else []) + absolute
    root = next((r for a in candidates if a.startswith("/")
                 for r in [find_root(a, members, workdir, exists, same)] if r is not None), None)
    warnings = []
    for index, arg in enumerate(args):
        flag, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if not value.startswith("/"):
            continue
        rel = _under(value, root)
        if rel is None:
            if index != script:
                warnings.append(f"argument {arg} is a path on this machine, outside the code "
                                "archive: the node must have it")
            continue
        moved = posixpath.relpath(rel, workdir) if workdir != "." else rel
        args[index] = f"{flag}{sep}{moved}"
    if script is not None:
        _check_script(command[script], args[script], members, workdir)
    return Relocated(args, workdir, warnings)


def _under(path: str, root: PurePosixPath | None) -> str | None:
    if root is None:
        return None
    target = PurePosixPath(posixpath.normpath(path))
    if target != root and root not in target.parents:
        return None
    return target.relative_to(root).as_posix()


def _check_script(given: str, moved: str, members: set[str], workdir: str) -> None:
    if moved.startswith("/") and named_roots(moved, members):
        raise ConfigError(f"the entry point {given} differs from the copy in the run's code "
                          "archive, which is what the node would run: freeze the run again "
                          "(burst push) or restore the script")
    if moved.startswith("/"):
        raise ConfigError(f"the entry point {given} is outside the run's code archive: put "
                          "it in the project that was archived, or give the command after "
                          "-- as it runs from the project's directory")
    inside = posixpath.normpath(posixpath.join(workdir, moved))
    if inside.startswith("..") or inside not in members:
        where = "the archive's root" if workdir == "." else f"{workdir}/ in the archive"
        raise ConfigError(f"the entry point {given} is not in the run's code archive "
                          f"(relative paths start at {where})")

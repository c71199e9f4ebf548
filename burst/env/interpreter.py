"""The node's Python: how a node comes to run the interpreter the run's lockfile names.

A run frozen on Python 3.11 needs CPython 3.11 on the node: its wheels (torch first) are
built for that minor only. SkyPilot's default images are Ubuntu 22.04 with Python 3.10,
another distribution has another ``python3`` (Debian 13: 3.13, Alibaba Cloud Linux 3 and
RHEL 8: 3.6), so the node often has not got it. The ways it can, decided here before
anything is launched (``burst plan`` and ``burst check`` say which, ``burst resume`` acts):

- ``image``: the node's image has it (the lock is on 3.10, SkyPilot's default images);
- ``shipped``: a standalone (relocatable) CPython of that minor from this machine, the
  one uv manages (``uv python find --managed-python``; ``$BURST_NODE_INTERPRETER`` names
  another install directory), packed once into the store at ``python/<sha256>/<file>``,
  shared by every run, and named in the run's wheelhouse index: the node fetches it from
  the store (which is all it reaches), checks its hash and unpacks it;
- ``uv``: the node installs the minor itself with uv (shipped in the wheelhouse), from
  python-build-standalone's releases or ``$BURST_PYTHON_MIRROR``, forwarded from
  ``$UV_PYTHON_INSTALL_MIRROR`` here (mainland China: a domestic mirror of those releases).

A node that has the lock's Python on its PATH always uses it; the others are fallbacks,
in this order, and the bootstrap says which it took.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burst.contract import ENV_PYTHON_MIRROR
from burst.env.lockfile import Lockfile
from burst.errors import ConfigError
from burst.store.base import Store, check_key

EXPLICIT_ENV = "BURST_NODE_INTERPRETER"  # an install directory of a relocatable CPython
UV_MIRROR_ENV = "UV_PYTHON_INSTALL_MIRROR"  # uv's own name for it, read here
IMAGE_PYTHON = "3.10"  # SkyPilot's default images (Ubuntu 22.04) on AWS, GCP, Kubernetes
ROUTES = ("image", "shipped", "uv")
INDEX_FIELD = "interpreter"  # where the wheelhouse index names a shipped interpreter
LEFT_OUT = ("__pycache__", "test", "idle_test", "tkinter", "idlelib", "turtledemo")

Say = Callable[[str], None]


@dataclass(frozen=True)
class Standalone:
    """A relocatable CPython on this machine: its install directory and version."""

    home: Path  # holds bin/ and lib/
    version: str  # "3.11.2"

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def executable(self) -> str:
        return f"bin/python{self.minor}"


@dataclass(frozen=True)
class Route:
    """How the node gets the lock's Python, and the line that says so."""

    kind: str  # one of ROUTES
    python: str  # the lock's major.minor
    why: str
    standalone: Standalone | None = None


def lock_minor(lock: Lockfile) -> str:
    return ".".join(str(lock.python.get("version", "")).split(".")[:2])


def route(lock: Lockfile, images: Sequence[str | None] = (None,),
          environ: Mapping[str, str] | None = None) -> Route:
    """The way the node gets the lock's Python (``images``: each candidate's image_id,
    None for SkyPilot's default)."""
    environ = dict(os.environ if environ is None else environ)
    minor = lock_minor(lock)
    if minor == IMAGE_PYTHON and all(image is None for image in images):
        return Route("image", minor, f"SkyPilot's default images (Ubuntu 22.04) have Python "
                     f"{minor}")
    standalone = find_standalone(minor, environ)
    if standalone is not None:
        return Route("shipped", minor, f"the node gets Python {standalone.version} from the "
                     f"store (a standalone build from {standalone.home})", standalone)
    mirror = mirror_url(environ)
    source = f"from {mirror}" if mirror else ("from python-build-standalone's releases on "
                                              "GitHub (unreachable from mainland China: set "
                                              f"${UV_MIRROR_ENV} here)")
    return Route("uv", minor, f"a node without Python {minor} installs it with uv {source}; "
                 f"to ship it instead: uv python install {minor} here")


def mirror_url(environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    return (environ.get(ENV_PYTHON_MIRROR) or environ.get(UV_MIRROR_ENV) or "").strip() or None


def forwarded(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The task envs for the node's uv: the Python download mirror, when set here."""
    mirror = mirror_url(environ)
    return {ENV_PYTHON_MIRROR: mirror} if mirror else {}


# -- finding one here -----------------------------------------------------------------------


def find_standalone(minor: str, environ: Mapping[str, str] | None = None) -> Standalone | None:
    """A relocatable CPython ``minor`` here: ``$BURST_NODE_INTERPRETER``, else uv's."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(EXPLICIT_ENV)
    if explicit:
        found = _standalone_at(Path(explicit).expanduser())
        if found is None or found.minor != minor:
            raise ConfigError(f"${EXPLICIT_ENV}={explicit} is not a CPython {minor} install "
                              f"directory (bin/python{minor} and lib/python{minor}/)")
        return found
    uv = _uv()
    if uv is None:
        return None
    try:
        done = subprocess.run([uv, "python", "find", "--managed-python", "--no-project",
                               "--no-config", minor], capture_output=True, text=True,
                              timeout=120, check=False, env={**os.environ, **environ})
    except (OSError, subprocess.SubprocessError):
        return None
    path = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() \
        else ""
    if not path:
        return None
    found = _standalone_at(Path(path).resolve().parent.parent)
    return found if found is not None and found.minor == minor else None


def _uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return shutil.which("uv")


def _standalone_at(home: Path) -> Standalone | None:
    """The install directory ``home`` if it holds a CPython that runs from where it is."""
    pythons = sorted(home.glob("bin/python3.*[0-9]"))
    if not pythons:
        return None
    try:
        done = subprocess.run([str(pythons[0]), "-c", "import sys, platform; "
                               "print(platform.python_version(), sys.prefix)"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    version, _, prefix = done.stdout.strip().partition(" ")
    if done.returncode != 0 or Path(prefix).resolve() != home.resolve():
        return None  # not relocatable: it looks for its library somewhere else
    return Standalone(home.resolve(), version)


# -- packing and shipping -------------------------------------------------------------------


def interpreter_key(sha256: str, filename: str) -> str:
    return check_key(f"python/{sha256}/{filename}")


def pack(standalone: Standalone, cache: Path) -> Path:
    """``standalone`` as a gzipped tar with one top directory, ``python/`` (as
    python-build-standalone's ``install_only`` archives), without byte code and the test
    suite; built once per install (cached by its path, version and newest change)."""
    machine = platform.machine().lower()
    stamp = max((p.stat().st_mtime_ns for p in standalone.home.rglob("*") if p.is_file()),
                default=0)
    tag = hashlib.sha256(f"{standalone.home}|{standalone.version}|{stamp}".encode()).hexdigest()
    out = cache / f"cpython-{standalone.version}-linux-{machine}-{tag[:12]}.tar.gz"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".part")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                  compresslevel=6) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _members(standalone.home):
            info = tar.gettarinfo(str(path), "python/" + str(path.relative_to(standalone.home)))
            if info.islnk():  # a hard link: stored as the file it is (the node refuses links)
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", path.stat().st_size
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    os.replace(partial, out)
    return out


def _members(home: Path) -> list[Path]:
    out = []
    for path in sorted(home.rglob("*")):
        parts = path.relative_to(home).parts
        if any(part in LEFT_OUT for part in parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink() or path.is_file() or path.is_dir():
            out.append(path)
    return out


def ship(store: Store, standalone: Standalone, cache: Path, say: Say | None = None
         ) -> dict[str, Any]:
    """Upload the packed ``standalone`` unless the store has it; its index entry."""
    archive = pack(standalone, cache)
    digest = _sha256(archive)
    key = interpreter_key(digest, archive.name)
    size = archive.stat().st_size
    if store.size(key) != size:
        if say:
            say(f"shipping Python {standalone.version} to the store ({size / 1e6:.0f} MB, "
                "once per store)")
        store.put(key, archive.read_bytes())
    return {"file": archive.name, "key": key, "sha256": digest, "size": size,
            "version": standalone.version, "python": standalone.minor,
            "machine": platform.machine().lower(), "executable": standalone.executable}


def record(store: Store, index_key: str, entry: dict[str, Any]) -> None:
    """Name the shipped interpreter in a wheelhouse index (rewritten only if it changed)."""
    index = json.loads(store.get(index_key))
    if index.get(INDEX_FIELD) == entry:
        return
    index[INDEX_FIELD] = entry
    store.put(index_key, (json.dumps(index, sort_keys=True, indent=1) + "\n").encode())


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def for_run(store: Store, run_id: str, images: Sequence[str | None] = (None,)
            ) -> Route | None:
    """How a node of ``run_id`` gets the lock's Python (None: the run was never frozen,
    the node's own Python is used); a shipped interpreter already in the store counts."""
    from burst.env import freeze, wheelhouse
    from burst.env.lockfile import LockfileError

    try:
        lock, _ = freeze.load_frozen(store, run_id)
    except LockfileError:
        return None
    index = wheelhouse.load_index(store, run_id, lock.digest) or {}
    shipped = index.get(INDEX_FIELD) or {}
    if shipped.get("python") == lock_minor(lock) and store.size(str(shipped.get("key"))) \
            == shipped.get("size"):
        return Route("shipped", lock_minor(lock), f"the store holds Python "
                     f"{shipped.get('version')} for the node (a standalone build)")
    return route(lock, images)


def describe(chosen: Route | None) -> str:
    """One line for ``burst plan`` and ``burst check``: how the node gets its Python."""
    if chosen is None:
        return "the run was never frozen: the node's own Python is used"
    return f"Python {chosen.python} on the node: {chosen.kind} ({chosen.why})"


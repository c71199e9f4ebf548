"""A node that is not this machine, built once and kept between test runs.

- :func:`debian_root`: another distribution's root for the sealed stub node
  (``debootstrap --variant=minbase --include=python3,python3-venv trixie``: Debian 13,
  Python 3.13, from Debian's package registry, under a minute here to a few);
- :func:`standalone_python`: a relocatable CPython of this machine's minor (3.11), built
  from Debian's own source package (``apt-get source``, about 2 minutes on 2 cores), laid
  out where uv keeps the interpreters it manages (``cpython-3.11.2-linux-x86_64-gnu`` in
  ``$UV_PYTHON_INSTALL_DIR``): the laptop's uv cache, as a user who ran ``uv python
  install 3.11`` has it. (uv itself downloads python-build-standalone from GitHub, which
  these machines cannot reach.)

Both live under ``$BURST_TEST_CACHE`` (default ``~/.cache/burst-tests``), keyed by what
they are built from; a build goes to a temporary directory renamed into place, under a
lock, so two processes never build one twice or see half of one.

Both need Debian's package registry, so they are built before the tests run
(``python -m tests.helpers.node_world``, which ``scripts/test.sh`` calls), never by a
test: nothing in the suite reaches beyond loopback. A fixture finding one missing fails
and names that command.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

SUITE = "trixie"
INCLUDE = ("python3", "python3-venv")
MIRROR = "http://deb.debian.org/debian"
PYTHON_SOURCE = "python3.11"  # Debian 12's source package of this machine's minor
SOURCE_SUITE = "bookworm"
CONFIGURE = ("--without-ensurepip", "--with-ensurepip=install")  # ensurepip kept in the tree
LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3/tests")
BUILDING = "BURST_TEST_BUILD_NODE_WORLD"  # set by main(): builds may download


def cache_root() -> Path:
    return Path(os.environ.get("BURST_TEST_CACHE") or Path.home() / ".cache" / "burst-tests")


def why_not() -> str | None:
    """Why this machine cannot build the node's world (None: it can)."""
    if os.geteuid() != 0:
        return "debootstrap and a sealed node need root"
    missing = [t for t in ("debootstrap", "apt-get", "make", "cc") if not shutil.which(t)]
    return f"{', '.join(missing)} not installed (scripts/test.sh installs them)" if missing \
        else None


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(tmp)`` into a sibling and renamed, unless there; in a
    test (``BUILDING`` unset) a missing one is an error, not a download."""
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / ".complete").exists():
            return target
        if not os.environ.get(BUILDING):
            raise RuntimeError(f"{target} is not built: run `python -m tests.helpers.node_world`"
                               " first (scripts/test.sh does; it needs the network)")
        shutil.rmtree(target, ignore_errors=True)
        partial = target.parent / f"{target.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        build(partial)
        (partial / ".complete").write_text("ok\n")
        partial.rename(target)
    return target


def _run(argv: list[str], **kwargs: object) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr)[-3000:]}")


def debian_root() -> Path:
    """Debian 13's minimal root with Python 3.13 (cached by suite and package list)."""
    key = hashlib.sha256(f"{SUITE}|minbase|{','.join(sorted(INCLUDE))}|{MIRROR}".encode())
    target = cache_root() / "roots" / f"{SUITE}-{key.hexdigest()[:12]}"

    def build(partial: Path) -> None:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE,
              str(partial), MIRROR], timeout=1800)

    return _built(target, build)


def standalone_python() -> Path:
    """The uv-style install directory (``$UV_PYTHON_INSTALL_DIR``) holding a relocatable
    CPython 3.11 built from Debian's source package."""
    key = hashlib.sha256(f"{PYTHON_SOURCE}|{SOURCE_SUITE}|{' '.join(CONFIGURE)}".encode())
    target = cache_root() / f"uv-python-{key.hexdigest()[:12]}"

    def build(partial: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="burst-cpython-") as tmp:
            work = Path(tmp)
            source = _debian_source(work)
            tree = work / "build"
            tree.mkdir()
            _run(["tar", "xf", str(source), "-C", str(tree), "--strip-components=1"])
            prefix = "/opt/burst-test-python"
            _run(["./configure", f"--prefix={prefix}", *CONFIGURE], cwd=tree, timeout=900)
            _run(["make", f"-j{os.cpu_count() or 2}"], cwd=tree, timeout=3600)
            _run(["make", "install", f"DESTDIR={work / 'dest'}"], cwd=tree, timeout=900)
            version = subprocess.run([str(work / "dest" / prefix.lstrip("/") / "bin" /
                                          "python3"), "-c", "import platform; "
                                      "print(platform.python_version())"],
                                     capture_output=True, text=True, check=True).stdout.strip()
            home = partial / f"cpython-{version}-linux-{os.uname().machine}-gnu"
            home.parent.mkdir(parents=True)
            shutil.move(str(work / "dest" / prefix.lstrip("/")), str(home))
        for name in LEFT_OUT:
            shutil.rmtree(next(home.glob("lib/python3.*")) / name, ignore_errors=True)

    return _built(target, build)


def _debian_source(work: Path) -> Path:
    """The upstream tarball of Debian's source package (apt-get source, a private
    source list: this machine's apt configuration is left as it is)."""
    lists = work / "lists"
    (lists / "partial").mkdir(parents=True)
    parts = work / "sources"
    parts.mkdir()
    (parts / "src.sources").write_text(
        f"Types: deb-src\nURIs: {MIRROR}\nSuites: {SOURCE_SUITE}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    options = ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}",
               "-o", f"Dir::State::Lists={lists}"]
    _run(["apt-get", *options, "update", "-qq"], timeout=600)
    _run(["apt-get", *options, "source", "--download-only", PYTHON_SOURCE], cwd=work,
         timeout=600)
    tarballs = sorted(work.glob(f"{PYTHON_SOURCE}_*.orig.tar.*"))
    if not tarballs:
        raise RuntimeError(f"apt-get source {PYTHON_SOURCE} left no upstream tarball")
    return tarballs[0]


def _or_skip(build: Callable[[], Path]) -> Path:
    why = why_not()
    if why:
        pytest.skip(why)
    return build()


@pytest.fixture(scope="session")
def other_distribution() -> Path:
    """Debian 13's root (Python 3.13) for a sealed node: built once, then cached."""
    return _or_skip(debian_root)


@pytest.fixture(scope="session")
def uv_python_dir() -> Path:
    """``$UV_PYTHON_INSTALL_DIR`` with a standalone CPython 3.11: built once, then cached."""
    return _or_skip(standalone_python)


def main() -> int:
    """Build (or find cached) both parts of the node's world, before any test runs."""
    why = why_not()
    if why:
        print(f"node world not built: {why}; the tests that need it skip")
        return 0
    os.environ[BUILDING] = "1"
    for build in (debian_root, standalone_python):
        print(f"node world: {build()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

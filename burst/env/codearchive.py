"""The training code as a content-addressed archive that rebuilds the tree on another node.

In a git repository the archive holds what ``git`` would call the working tree: tracked
files as they are on disk (so uncommitted edits are in) plus untracked files git does not
ignore. The commit, branch and remote (credentials stripped) and the uncommitted diff are
recorded beside it, for people; the archive alone restores the code, so the new node
needs no access to the repository. Outside a repository the directory itself is archived.

Outside a repository the directory is listed by ``git`` too (with a throwaway git
directory), so every ``.gitignore`` applies as it would in a repository; without ``git``
installed the directory is walked instead.

Never captured: anything under ``.git/``, secret files by name (``.env``, ``*.pem``,
``id_*``, ``.netrc`` ... see :mod:`burst.redact`), any file holding a PEM private key,
virtual environments, caches, and every burst store or local tier in the tree (this
run's, named by the caller, and any other run's, recognised by its layout: a run
directory holds two of ``events.jsonl``, ``snapshots/<step>.json``, ``blobs/<xx>/<hash>``,
``code/<hash>.tar.gz``, ``env/lock-<hash>.json``, ``uploads/``). Otherwise a project run
from a folder holding earlier runs' stores archives them, archives included, and grows
with every run until it hits the cap. ``.burstignore`` (gitignore-like patterns, one a
line) excludes more.

Every ``git`` call goes through :mod:`burst.staging.spawn`, which holds no pipe a concurrent
``fork`` (a DataLoader worker) could inherit: a capture in a background thread of a
training process cannot hang.

The tar is deterministic (sorted members, fixed mtime, uid 0, no user names), so its
SHA-256 names it and an unchanged tree is never uploaded twice: ``<run>/code/<hash>.tar.gz``.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst.errors import BurstError, ConfigError, SnapshotError
from burst.redact import holds_private_key, is_secret_path, scrub_text, strip_url
from burst.staging import spawn
from burst.store.base import Store

DEFAULT_MAX_BYTES = 64 << 20
MAX_BYTES_ENV = "BURST_CODE_MAX_BYTES"
# 1980-01-02 UTC: late enough that a zip built from restored files (a wheel of an editable
# project) never meets a pre-1980 timestamp in any time zone.
FIXED_MTIME = 315_619_200
_SKIP_DIRS = {".git", "__pycache__", ".burst", ".mypy_cache", ".pytest_cache", ".ruff_cache",
              ".tox", ".nox", ".ipynb_checkpoints", "node_modules", ".eggs", ".hg", ".svn"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class CodeTooLarge(BurstError):
    """The tree to archive exceeds the size cap."""


@dataclass
class Captured:
    """An archive ready to upload, and what it is."""

    tar_gz: bytes
    digest: str  # sha256 of the uncompressed tar
    files: int
    size: int  # uncompressed bytes of file content
    root: str  # the archived directory on this machine (not stored)
    git: dict[str, Any] | None = None
    diff: bytes = b""
    skipped: list[dict[str, str]] = field(default_factory=list)
    cwd: str = "."  # the working directory, relative to the root

    def ref(self) -> dict[str, Any]:
        """The small record a manifest keeps: enough to fetch and trust the archive."""
        ref: dict[str, Any] = {"archive": self.digest, "files": self.files, "bytes": self.size,
                               "cwd": self.cwd, "git": self.git,
                               "skipped": [s["path"] for s in self.skipped]}
        if self.diff:
            ref["diff"] = hashlib.sha256(self.diff).hexdigest()
        return ref


def capture(start: Path | str | None = None, *, max_bytes: int | None = None,
            exclude: Iterable[Path] = ()) -> Captured:
    """Archive the project around ``start`` (default: the current directory)."""
    start = Path(start or Path.cwd()).resolve()
    cap = _max_bytes(max_bytes)
    top = _git(start, "rev-parse", "--show-toplevel")
    root = Path(top).resolve() if top else start
    _refuse_home(root)
    excluded = [Path(p).resolve() for p in exclude]
    candidates = _git_files(root) if top else _listed(root)
    stores = _store_dirs(candidates)
    excluded += [root / d for d in stores]
    files, skipped = _select(root, candidates, excluded, _burstignore(root))
    skipped += [{"path": f"{d}/", "reason": "a burst store (not archived)"} for d in stores]
    _check_size(root, files, cap)
    tar, size = _tar(root, files, skipped)
    digest = hashlib.sha256(tar).hexdigest()
    git = _git_info(root) if top else None
    diff = _diff(root, files) if top and git and git.get("dirty") else b""
    # level 1: a third of level 6's CPU (0.03 s against 0.095 s for burst's own 2.4 MB of
    # source) for a fifth more bytes; every training process pays it at its start, beside
    # its first steps, and the digest is the tar's, whatever the level
    return Captured(gzip.compress(tar, compresslevel=1, mtime=0), digest, len(files), size,
                    str(root), git, diff, skipped, start.relative_to(root).as_posix())


def _max_bytes(value: int | None) -> int:
    if value is not None:
        return value
    raw = os.environ.get(MAX_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"${MAX_BYTES_ENV} must be a number of bytes") from None


def _refuse_home(root: Path) -> None:
    """A home directory or / is never a project: archiving it would sweep up everything."""
    if root in (Path.home().resolve(), Path("/")):
        raise ConfigError(f"refusing to archive {root} as training code: run from the "
                          f"project directory (or a git repository)")


# -- choosing files ----------------------------------------------------------------------

GIT_TIMEOUT = 60.0  # seconds for one git command; a hung git costs the code, never the run


def _git(cwd: Path, *args: str) -> str | None:
    done = _run_git(["-C", str(cwd), *args])
    return done.stdout.decode("utf-8", "surrogateescape").strip() if done and done.ok else None


def _run_git(args: list[str], timeout: float = GIT_TIMEOUT) -> spawn.Done | None:
    """``git`` through :mod:`spawn` (fork-safe); None when git is not installed."""
    try:
        return spawn.run(["git", *args], timeout=timeout,
                         env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except OSError:
        return None


# what git need not even list: the directories the selection drops anyway
_LIST_EXCLUDES = [f"--exclude={name}/" for name in sorted(_SKIP_DIRS)]


def _git_files(root: Path, git_dir: Path | None = None) -> list[str]:
    """Tracked and untracked-not-ignored paths, as git sees them (no ``.git/``)."""
    where = ["--git-dir", str(git_dir), "--work-tree", str(root)] if git_dir else ["-C", str(root)]
    done = _run_git([*where, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                     *_LIST_EXCLUDES], timeout=2 * GIT_TIMEOUT)
    if done is None or not done.ok:
        detail = done.stderr.decode(errors="replace").strip() if done else "git is not installed"
        if done is not None and done.returncode is None:
            detail = f"timed out after {2 * GIT_TIMEOUT:.0f} s"
        raise BurstError(f"git ls-files failed in {root}: {scrub_text(detail)}")
    return sorted({p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def _listed(root: Path) -> list[str]:
    """A directory outside any repository, listed as git would list it in one (so its
    ``.gitignore`` files apply); walked plainly when git is not installed or fails."""
    with tempfile.TemporaryDirectory(prefix="burst-gitdir-") as scratch:
        init = _run_git(["init", "-q", scratch])
        if init is not None and init.ok:
            try:
                return _git_files(root, Path(scratch) / ".git")
            except BurstError:
                pass
    return sorted(_walk(root))


_HEX = "[0-9a-f]"
_MARKERS = {  # what each file of a burst run directory looks like, from that directory
    "events": re.compile(r"events\.jsonl"),
    "snapshots": re.compile(r"snapshots/\d+\.json"),
    "blobs": re.compile(rf"blobs/({_HEX}{{2}})/\1{_HEX}{{14,}}"),
    "code": re.compile(rf"code/(latest\.json|{_HEX}{{16,}}\.(tar\.gz|patch))"),
    "env": re.compile(rf"env/(lockfile\.json|(lock|wheelhouse)-{_HEX}{{16,}}\.json)"),
    "uploads": re.compile(r"uploads/\.?\d+\.json.*"),
}
_MARKER_DEPTH = {"events": 1, "blobs": 3}  # path components below the run directory
_WHEEL = re.compile(rf"wheels/{_HEX}{{16,}}/[^/]+\.whl")  # a store's shared wheelhouse
_MAYBE = re.compile(r"(^|/)(events\.jsonl|snapshots|blobs|code|env|uploads|wheels)(/|$)")


def _store_dirs(candidates: Iterable[str]) -> list[str]:
    """The burst run directories (and shared wheelhouses) among ``candidates``' folders,
    by layout: a folder holding files of two kinds a run directory holds. Never the
    project root itself, and only the outermost of nested ones."""
    kinds: dict[str, set[str]] = {}
    found: set[str] = set()
    for rel in candidates:
        if not _MAYBE.search(rel):  # the cheap test first: most files are nothing of a store
            continue
        parts = rel.split("/")
        for kind, pattern in _MARKERS.items():
            depth = _MARKER_DEPTH.get(kind, 2)
            if len(parts) > depth and pattern.fullmatch("/".join(parts[-depth:])):
                kinds.setdefault("/".join(parts[:-depth]), set()).add(kind)
        if len(parts) >= 3 and _WHEEL.fullmatch("/".join(parts[-3:])):
            found.add("/".join(parts[:-2]))
    found |= {folder for folder, seen in kinds.items() if len(seen) >= 2}
    outer = sorted(found)
    return [d for d in outer if not any(d.startswith(o + "/") for o in outer)]


def _walk(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        keep = []
        for name in dirnames:
            if (here / name).is_symlink():
                filenames.append(name)  # archived as a link, never followed
            elif name not in _SKIP_DIRS:
                keep.append(name)
        dirnames[:] = sorted(keep)
        for name in filenames:
            yield (here / name).relative_to(root).as_posix()


def _burstignore(root: Path) -> list[str]:
    try:
        lines = (root / ".burstignore").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(relpath: str, patterns: list[str]) -> bool:
    parts = relpath.split("/")
    for pattern in patterns:
        bare = pattern.strip("/")
        if "/" in bare:
            if fnmatch.fnmatchcase(relpath, bare) or relpath.startswith(bare + "/"):
                return True
        elif any(fnmatch.fnmatchcase(part, bare) for part in parts):
            return True
    return False


def _select(root: Path, candidates: Iterable[str], excluded: list[Path],
            ignore: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    """The files to archive, and the ones left out for a reason a user should see."""
    files, skipped = [], []
    venvs: set[str] = set()
    for rel in sorted(candidates):
        path = root / rel
        parts = rel.split("/")
        if any(part in _SKIP_DIRS for part in parts[:-1]) or rel.endswith(_SKIP_SUFFIXES):
            continue
        if any(rel.startswith(v + "/") for v in venvs) or _in_venv(root, parts, venvs):
            continue
        if any(_under(path, e) for e in excluded) or _ignored(rel, ignore):
            continue
        if is_secret_path(rel):
            skipped.append({"path": rel, "reason": "secret file name"})
            continue
        if path.is_symlink():
            if _safe_link(root, path):
                files.append(rel)
            else:
                skipped.append({"path": rel, "reason": "symlink leaving the project"})
            continue
        if not path.is_file():
            if path.is_dir():
                skipped.append({"path": rel, "reason": "git submodule (not archived)"})
            continue  # deleted in the working tree: absent, as on disk
        if _holds_key(path):
            skipped.append({"path": rel, "reason": "contains a private key"})
            continue
        files.append(rel)
    return files, skipped


def _in_venv(root: Path, parts: list[str], venvs: set[str]) -> bool:
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if (root / prefix / "pyvenv.cfg").is_file():
            venvs.add(prefix)
            return True
    return False


def _under(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent)
    except ValueError:
        return False
    return True


def _safe_link(root: Path, path: Path) -> bool:
    target = os.readlink(path)
    if os.path.isabs(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def _holds_key(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return holds_private_key(f.read(1 << 20))
    except OSError:
        return False


def _check_size(root: Path, files: list[str], cap: int) -> None:
    sizes = {rel: (root / rel).lstat().st_size for rel in files}
    total = sum(sizes.values())
    if total <= cap:
        return
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    listing = ", ".join(f"{rel} ({_mib(n)})" for rel, n in largest)
    raise CodeTooLarge(
        f"the code to archive is {_mib(total)} in {len(files)} files, over the {_mib(cap)} cap; "
        f"largest: {listing}. Exclude data and checkpoints with .gitignore or .burstignore, "
        f"or raise the cap with ${MAX_BYTES_ENV} / --max-code-bytes")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# -- the archive -------------------------------------------------------------------------

def _tar(root: Path, files: list[str], skipped: list[dict[str, str]]) -> tuple[bytes, int]:
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            path = root / rel
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue  # vanished while archiving: absent, as on disk
            if holds_private_key(data):  # changed since it was checked: still never archived
                skipped.append({"path": rel, "reason": "contains a private key"})
                continue
            info.size, info.mode = len(data), 0o755 if mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
            total += len(data)
    return buffer.getvalue(), total


def _git_info(root: Path) -> dict[str, Any]:
    remote = _git(root, "config", "--get", "remote.origin.url")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    return {"commit": _git(root, "rev-parse", "--verify", "-q", "HEAD"),
            "branch": _git(root, "symbolic-ref", "--short", "-q", "HEAD"),
            "remote": strip_url(remote) if remote else None,
            "dirty": bool(status)}


def _diff(root: Path, files: list[str]) -> bytes:
    """``git diff HEAD`` of the archived (so never secret) and of the deleted tracked files."""
    changed = _git(root, "diff", "HEAD", "--name-only", "-z")
    if not changed:
        return b""
    archived = set(files)
    keep = sorted(p for p in changed.split("\0") if p in archived or (
        p and not is_secret_path(p) and not (root / p).exists()))  # deleted files too
    if not keep:
        return b""
    done = _run_git(["-C", str(root), "diff", "HEAD", "--binary", "--", *keep],
                    timeout=2 * GIT_TIMEOUT)
    return done.stdout if done and done.ok else b""


# -- the store ---------------------------------------------------------------------------

def archive_key(run_id: str, digest: str) -> str:
    return f"{run_id}/code/{digest}.tar.gz"


def diff_key(run_id: str, digest: str) -> str:
    return f"{run_id}/code/{digest}.patch"


def latest_key(run_id: str) -> str:
    return f"{run_id}/code/latest.json"


def upload(store: Store, run_id: str, captured: Captured) -> tuple[dict[str, Any], bool]:
    """Put the archive (only if the store lacks it), its diff, and the run's newest code
    reference; return the reference and whether the archive was new."""
    ref = captured.ref()
    new = store.size(archive_key(run_id, captured.digest)) is None
    if new:
        new = store.put_if_absent(archive_key(run_id, captured.digest), captured.tar_gz)
    if captured.diff and store.size(diff_key(run_id, ref["diff"])) is None:
        store.put_if_absent(diff_key(run_id, ref["diff"]), captured.diff)
    store.put(latest_key(run_id), json.dumps(ref, sort_keys=True, indent=1).encode())
    return ref, new


def latest_ref(store: Store, run_id: str) -> dict[str, Any] | None:
    try:
        ref = json.loads(store.get(latest_key(run_id)))
    except (KeyError, ValueError):
        return None
    return ref if isinstance(ref, dict) else None


def restore(store: Store, run_id: str, ref: dict[str, Any], dest: Path | str) -> list[str]:
    """Unpack the archive ``ref`` names into ``dest``; return the restored paths.

    The archive's bytes must hash to its name, and extraction refuses absolute paths,
    ``..``, links out of ``dest`` and device files (see :func:`unpack`).
    """
    digest = str(ref.get("archive", ""))
    try:
        packed = store.get(archive_key(run_id, digest))
    except (KeyError, SnapshotError):
        raise SnapshotError(f"code archive {digest[:12] or '?'} of run {run_id!r} is not in "
                            f"{store.url}") from None
    return unpack(packed, digest, dest, limit=int(ref.get("bytes", 0)) * 2 + (16 << 20))


def unpack(packed: bytes, digest: str, dest: Path | str, limit: int, *,
           data_filter: bool | None = None) -> list[str]:
    """Extract a code archive whose tar hashes to ``digest`` into ``dest``.

    Every member is checked here (no absolute path, no ``..``, no link leading out of
    ``dest``, no device file) and the extraction also uses tarfile's ``data`` filter where
    this Python has one (3.10.12+, 3.11.4+; ``data_filter=None``: when available). A
    node's stock Python may be older: the checks alone guard it then.
    """
    use_filter = hasattr(tarfile, "data_filter") if data_filter is None else data_filter
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(packed)) as stream:
            tar_bytes = stream.read(limit + 1)
    except (OSError, EOFError) as error:
        raise SnapshotError(f"code archive {digest[:12]} is corrupt: {error}") from None
    if len(tar_bytes) > limit or hashlib.sha256(tar_bytes).hexdigest() != digest:
        raise SnapshotError(f"code archive {digest[:12]} does not match its hash: refusing it")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(dest, member)
                _clear_link(dest, member)
            if use_filter:
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except tarfile.TarError as error:
        raise SnapshotError(f"code archive {digest[:12]} is unsafe or corrupt: {error}") from None
    return [m.name for m in members]


def _check_member(dest: Path, member: tarfile.TarInfo) -> None:
    """Refuse a member that would write or point outside ``dest``, or is not a plain file,
    directory or link; make its mode and owner harmless (what the ``data`` filter does)."""
    root = dest.resolve()
    name = member.name
    path = dest / name
    if name.startswith("/") or ".." in name.split("/") or not (
            path == dest or _within(root, path.parent)):
        raise tarfile.TarError(f"member {name!r} leaves the destination")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise tarfile.TarError(f"member {name!r} is a device, fifo or other special file")
    if member.issym():
        target = os.path.join(os.path.dirname(name), member.linkname)
        if os.path.isabs(member.linkname) or not _within(root, dest / target):
            raise tarfile.TarError(f"link {name!r} points outside the destination")
    if member.islnk() and (os.path.isabs(member.linkname)
                           or not _within(root, dest / member.linkname)):
        raise tarfile.TarError(f"hard link {name!r} points outside the destination")
    member.mode = (member.mode & 0o755) | (0o600 if member.isfile() else 0)
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""


def _within(root: Path, path: Path) -> bool:
    """Whether ``path`` (links already on disk followed) stays under ``root``."""
    resolved = os.path.realpath(path)
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def _clear_link(dest: Path, member: tarfile.TarInfo) -> None:
    """An existing link at a member's path is replaced, never written through. Only paths
    that stay inside ``dest`` are touched; the others make the data filter refuse."""
    target = dest / member.name
    root = dest.resolve()
    if member.name.startswith("/") or ".." in member.name.split("/"):
        return
    if not _under(target.parent, root):
        return
    if target.is_symlink() or (member.issym() and target.is_file()):
        target.unlink()


def describe(ref: dict[str, Any]) -> dict[str, Any]:
    """A flat summary of a code reference for printing."""
    git = ref.get("git") or {}
    return {"archive": ref.get("archive"), "files": ref.get("files"), "bytes": ref.get("bytes"),
            "commit": git.get("commit"), "branch": git.get("branch"),
            "remote": git.get("remote"), "dirty": git.get("dirty"),
            "skipped": ref.get("skipped", [])}


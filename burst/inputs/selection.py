"""Which files are the run's inputs, which of them burst ships, and why not the others.

Inputs come from three places: what the run declares (``burst.Run(inputs=...)``,
``burst run --input``, ``[inputs] paths`` in the config file), what the recorder saw the
process read (:mod:`burst.inputs.recorder`), and the hub caches those reads fall in
(:mod:`burst.inputs.hubs`). A read path is not an input when it lies in the Python
environment (``sys.prefix``, the base prefix, site-packages), the system (``/usr``,
``/proc``...), burst's own stores, or is Python code; a secret (``~/.aws/credentials``,
``.env``, a private key: the code archive's rules) never travels; inside the project it is not one
when the code archive holds it already, but a file git ignores (nanoGPT's ``meta.pkl``
under ``*.pkl``) is: the archive lacks it, so it travels as an input, and the freeze says so.

Each input is a *root* the node places as a whole and exports one variable for (one inside
the project, such as a gitignored ``data/``, goes to the same place in the node's restored
code, where the script's relative paths find it): a
declared file or directory (all of it), a hub cache (only the files read under it), or
the directory of a file read elsewhere (its files, not its subdirectories, so a folder of
shards read one by one arrives whole even if the laptop's run had not reached the last).
A root that cannot be shipped (unreadable, a device or FIFO, over the size limit) is
*refused*: ``burst resume`` stops on it before launching anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import site
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst import config as user_config
from burst.errors import ConfigError
from burst.inputs import hubs, names
from burst.redact import holds_private_key, is_secret_path
from burst.staging import wheelcache

URL_SCHEMES = ("s3://", "oss://", "gs://")
DEFAULT_MAX_BYTES = 50 * 10**9
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
               "/proc", "/sys", "/dev", "/run", "/snap", "/var/lib", "/var/cache", "/boot")
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pth", ".so", ".pyi")
# folders whose files a process reads as tooling, never as data: a package's metadata (an
# editable install's, read by importlib.metadata; the node installs the package itself) and
# the caches of test and lint tools
TOOLING_DIRS = (".egg-info", ".dist-info", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                ".hypothesis", ".ipynb_checkpoints")
SECRET_SCAN_BYTES = 1 << 20  # files up to this size are searched for a private key
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


@dataclass
class Root:
    """One input the node places as a whole and exports one variable for."""

    path: str  # absolute here, or an object-storage URL
    kind: str  # file, dir, hub, url
    files: list[str] = field(default_factory=list)  # absolute paths of its files
    hub_env: str = ""  # for a hub cache: the variable its library reads (HF_HOME...)
    declared: bool = False
    env: str = ""  # the variable the node exports for it (set by name_variables)
    code_rel: str = ""  # inside the project: its path there (a node puts it in its code)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "env": self.env,
                "hub_env": self.hub_env, "declared": self.declared, "code_rel": self.code_rel}


@dataclass
class Selection:
    roots: list[Root] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # fine: not needed
    refused: list[dict[str, str]] = field(default_factory=list)  # cannot ship: resume stops
    mirrors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings for a person (gitignored...)
    ignored: dict[str, str] = field(default_factory=dict)  # read, git-ignored: path -> rule


@dataclass(frozen=True)
class Settings:
    """The user's choices: ``[inputs]`` in the config file, overridden by the environment."""

    paths: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    record: bool = True
    hub: str = "ship"  # or "mirror"
    exclude: tuple[str, ...] = ()


def settings(config: Mapping[str, Any] | None = None,
             environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    table = user_config.load() if config is None else config
    section = table.get(names.CONFIG_SECTION, {})
    if not isinstance(section, dict):
        raise ConfigError(f"config: [{names.CONFIG_SECTION}] must be a table")
    paths = [str(p) for p in section.get("paths", [])]
    paths += declared_in(env.get(names.INPUTS_ENV, ""))
    max_bytes = parse_size(env.get(names.MAX_BYTES_ENV) or section.get("max_bytes")
                           or DEFAULT_MAX_BYTES)
    hub = str(env.get(names.HUB_ENV) or section.get("hub") or "ship").strip().lower()
    if hub not in ("ship", "mirror"):
        raise ConfigError(f"inputs hub must be 'ship' or 'mirror', got {hub!r}")
    record = env.get(names.RECORD_ENV, str(section.get("record", True))).strip().lower()
    return Settings(tuple(paths), max_bytes, record not in ("0", "false", "no", "off"), hub,
                    tuple(str(p) for p in section.get("exclude", [])))


def declared_in(value: str) -> list[str]:
    """``$BURST_INPUTS``: a JSON list (``burst run --input``: URLs hold ``:``), or
    paths joined by ``os.pathsep`` when a person sets it by hand."""
    if value.lstrip().startswith("["):
        try:
            return [str(p) for p in json.loads(value)]
        except ValueError:
            raise ConfigError(f"${names.INPUTS_ENV} is not a JSON list of paths") from None
    return [p for p in value.split(os.pathsep) if p]


def declared_value(paths: Iterable[str]) -> str:
    """The ``$BURST_INPUTS`` value for ``paths``."""
    return json.dumps(list(paths))


def parse_size(value: object) -> int:
    """``20GB``, ``512MiB``, ``1e9``, ``1000`` -> bytes."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"inputs max_bytes: not a size: {value!r} (e.g. 20GB, 512MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def is_url(path: str) -> bool:
    return path.lower().startswith(URL_SCHEMES)


def environment_dirs(extra: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Where reads are the environment's or the system's, never the run's inputs."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            str(Path(__file__).resolve().parents[1])}  # burst itself, editable or not
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    dirs.update(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    home = Path.home()
    dirs.update(str(home / d) for d in (".cache/burst", ".cache/pip", ".cache/uv",
                                        ".config", ".nv", ".triton", ".local/lib"))
    dirs.add(os.fspath(wheelcache.cache_dir()))  # $BURST_WHEEL_CACHE: the stager reads it
    dirs.update(os.fspath(p) for p in extra)
    out = {os.path.realpath(d) for d in dirs if d} | {os.path.abspath(d) for d in dirs if d}
    return sorted(out | set(SYSTEM_DIRS))


def under(path: str, parent: str) -> bool:
    parent = parent.rstrip("/") or "/"
    return path == parent or path.startswith(parent + "/") or parent == "/"


def choose(settings_: Settings, declared: Iterable[str], recorded: Iterable[str], *,
           code_root: str | None, in_archive: set[str] | None,
           ignored: Mapping[str, str] | None = None,
           environment: Iterable[str] = (), hub_list: list[hubs.Hub] | None = None,
           environ: Mapping[str, str] | None = None) -> Selection:
    """Sort the run's declared and recorded paths into roots to ship, left out, refused.

    ``in_archive``: the code archive's members (relative to ``code_root``); ``ignored``:
    for files of the project outside it, the git rule that ignores each (for the note)."""
    out = Selection()
    hub_list = hubs.caches(environ) if hub_list is None else hub_list
    env_dirs = list(environment)
    roots: dict[str, Root] = {}
    for path in [*settings_.paths, *declared]:
        _declare(str(path), roots, out, settings_)
    for path in sorted(set(recorded)):
        _recorded(path, roots, out, settings_, code_root, in_archive or set(),
                  ignored or {}, env_dirs, hub_list, environ)
    for root in roots.values():
        _check(root, out, settings_)
    out.roots = [r for r in roots.values() if r.files or r.kind == "url"]
    for root in out.roots:  # the project's gitignored data/ goes beside the node's code
        if code_root and root.kind != "url" and under(root.path, code_root):
            root.code_rel = os.path.relpath(root.path, code_root)
    name_variables(out.roots)
    _say_ignored(out)
    return out


def _say_ignored(out: Selection) -> None:
    """A git-ignored file the run read travels as an input; if it cannot, the node's run
    will not find it: say so now, not after the card is paid for."""
    refused = {r["path"]: r["why"] for r in out.refused}
    shipped = {f for r in out.roots for f in r.files}
    for path, why in sorted(out.ignored.items()):
        if path in shipped:
            out.notes.append(f"{why}: it travels as an input")
        else:
            reason = refused.get(path) or next((s["why"] for s in out.skipped
                                                if s["path"] == path), "left out")
            out.notes.append(f"{why} and is not shipped ({reason}): the node's run will not "
                             "find it")


def _declare(path: str, roots: dict[str, Root], out: Selection, s: Settings) -> None:
    if is_url(path):
        roots.setdefault(path, Root(path, "url", declared=True))
        return
    absolute = os.path.abspath(os.path.expanduser(path))
    if _excluded(absolute, s):
        out.skipped.append({"path": absolute, "why": names.EXCLUDED})
        return
    try:
        mode = os.stat(absolute).st_mode
    except OSError as exc:
        out.refused.append({"path": absolute, "why": f"{names.UNREADABLE} ({exc.strerror})"})
        return
    if stat.S_ISDIR(mode):
        files = [f for f in _walk(absolute, out) if not _excluded(f, s)]
        roots[absolute] = Root(absolute, "dir", files, declared=True)
    else:
        roots[absolute] = Root(absolute, "file", [absolute], declared=True)


def _walk(top: str, out: Selection) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(top, onerror=lambda e: out.refused.append(
            {"path": str(e.filename), "why": f"{names.UNREADABLE} ({e.strerror})"})):
        dirs.sort()
        found += [os.path.join(folder, f) for f in sorted(files)]
    return found


def _recorded(path: str, roots: dict[str, Root], out: Selection, s: Settings,
              code_root: str | None, in_archive: set[str], ignored: Mapping[str, str],
              env_dirs: list[str], hub_list: list[hubs.Hub],
              environ: Mapping[str, str] | None) -> None:
    if path.endswith(CODE_SUFFIXES) or "/__pycache__/" in path or _tooling(path):
        return
    if any(under(path, d) for d in env_dirs) or not os.path.isfile(path):
        return  # the environment's, the system's, or gone (a temporary file)
    if any(r.kind in ("dir", "file") and under(path, r.path) for r in roots.values()):
        return  # declared already
    if code_root and under(path, code_root):
        rel = os.path.relpath(path, code_root)
        if rel in in_archive:
            out.skipped.append({"path": path, "why": names.IN_CODE})
            return
        if rel.split("/")[0].startswith((".venv", "venv", ".git", ".burst")):
            return
        if rel in ignored:
            out.ignored[path] = f"{rel} is ignored by git ({ignored[rel]}), not in the code archive"
    if _excluded(path, s):
        out.skipped.append({"path": path, "why": names.EXCLUDED})
        return
    hub = hubs.hub_of(path, hub_list)
    if hub is not None:
        mirror = hubs.mirror_of(hub, environ)
        if s.hub == "mirror" and mirror:
            out.mirrors.update(mirror)
            out.skipped.append({"path": path, "why": f"{names.MIRROR} ({', '.join(mirror)})"})
            return
        root = roots.setdefault(hub.root, Root(hub.root, "hub", hub_env=hub.env))
        root.files.append(path)
        return
    folder = os.path.dirname(path)
    if folder not in roots:
        siblings = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        if code_root and under(folder, code_root):  # the project's own files travel as code
            siblings = [p for p in siblings if os.path.relpath(p, code_root) not in in_archive
                        and not p.endswith(CODE_SUFFIXES)]
        roots[folder] = Root(folder, "dir", [p for p in siblings if _plain(p)
                                             and not _excluded(p, s)])
    if path not in roots[folder].files:
        roots[folder].files.append(path)


def _tooling(path: str) -> bool:
    return any(part.endswith(TOOLING_DIRS) for part in path.split("/")[:-1])


def _plain(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode) and os.access(path, os.R_OK)
    except OSError:
        return False


def _excluded(path: str, s: Settings) -> bool:
    return any(fnmatch.fnmatch(path, os.path.expanduser(p)) for p in s.exclude)


def _check(root: Root, out: Selection, s: Settings) -> None:
    """Refuse a root's unshippable files, and the root itself when over the limit."""
    if root.kind == "url":
        return
    total, good = 0, []
    for path in root.files:
        if secret(path):
            out.skipped.append({"path": path, "why": names.SECRET})
            continue
        why = unshippable(path)
        if why:
            out.refused.append({"path": path, "why": why})
            continue
        good.append(path)
        total += os.path.getsize(path)
    root.files = good
    if total > s.max_bytes:
        out.refused.append({"path": root.path, "why": f"{names.OVER_LIMIT} ({human(total)} > "
                            f"{human(s.max_bytes)}: raise [inputs] max_bytes or "
                            f"${names.MAX_BYTES_ENV})"})
        root.files = []


def human(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def secret(path: str) -> bool:
    """A file that must never reach a store: a secret name or folder (``~/.aws``,
    ``.env``, ``id_*``... as for the code archive) or a small file holding a private key."""
    if is_secret_path(path.lstrip("/")):
        return True
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SECRET_SCAN_BYTES:
            return False  # a FIFO would block the read; a large file is data
        with open(path, "rb") as source:
            return holds_private_key(source.read())
    except OSError:
        return False


def unshippable(path: str) -> str | None:
    """Why ``path`` cannot travel as an input file (None: it can)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"{names.UNREADABLE} ({exc.strerror})"
    if not stat.S_ISREG(mode):
        return names.DEVICE
    if not os.access(path, os.R_OK):
        return f"{names.UNREADABLE} (permission denied)"
    return None


def name_variables(roots: list[Root]) -> None:
    """``BURST_INPUT_<NAME>`` for each root, from its last path component, unique."""
    taken: set[str] = set()
    for root in roots:
        base = re.sub(r"[^A-Z0-9]+", "_", Path(root.path.rstrip("/")).name.upper()).strip("_")
        name = names.INPUT_ENV_PREFIX + (base or "ROOT")
        candidate, n = name, 2
        while candidate in taken:
            candidate, n = f"{name}_{n}", n + 1
        taken.add(candidate)
        root.env = candidate


def lines(selection: Selection) -> list[str]:
    """One line each for a person: what will be shipped, what will not, and why."""
    out = []
    for root in selection.roots:
        if root.kind == "url":
            out.append(f"input {root.path}: a reference (already in object storage)")
            continue
        size = sum(os.path.getsize(f) for f in root.files if os.path.exists(f))
        what = "hub cache" if root.kind == "hub" else "input"
        out.append(f"{what} {root.path}: shipping {len(root.files)} file(s), "
                   f"{human(size)} (node: ${root.env})")
    in_code = [s for s in selection.skipped if s["why"] == names.IN_CODE]
    if in_code:
        out.append(f"{len(in_code)} file(s) read inside the project: {names.IN_CODE}")
    out += [f"not shipping {s['path']}: {s['why']}" for s in selection.skipped
            if s["why"] != names.IN_CODE]
    out += [f"cannot ship {r['path']}: {r['why']}" for r in selection.refused]
    out += [f"warning: {note}" for note in selection.notes]
    return out

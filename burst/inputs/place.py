"""Inputs on a node: each placed where the script looks for it, and where that is.

``burst node setup`` calls :func:`place`: every input of the run's manifest is written from
the store's chunks, each chunk's hash and then the whole file's checked before the file is
renamed into place. An input goes to the same absolute path as on the machine that read
it when the node allows it (its directory can be created and written, and no different
file is in the way: a node's own data is never overwritten), otherwise under
``$BURST_NODE_DIR/inputs/<its absolute path>``. A file already there with the same
content is kept (a managed job's recovery runs setup again and fetches nothing twice).
``burst node run`` places them again before training: on a node whose setup and run share
a disk that finds every file in place (by size and mtime, nothing read), and a node whose
run does not see what setup wrote outside its home still gets them.

Where each input went is written to ``$BURST_NODE_DIR/inputs/placed.json``;
``burst node run`` exports it (:func:`node_env`): ``$BURST_INPUTS_MAP`` names that file,
``$BURST_INPUT_<NAME>`` holds each input's placed path, and a hub cache's own variable
(``HF_HOME``, ``TORCH_HOME``, ``MODELSCOPE_CACHE``) points its library at the placed
copy. :func:`input_path` is the script's side: the path an input of this run has on this
machine (on the machine that read it, or without a map, the path itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from burst.errors import SnapshotError
from burst.inputs import chunks, names
from burst.store.base import Store

Say = Callable[[str], None]
PLACED_FILE = "placed.json"


def place(store: Store, run_id: str, node_dir: Path, say: Say = print,
          code_dir: Path | None = None) -> dict[str, Any] | None:
    """Place the run's inputs on this node; the map written (None: the run has none).
    An input that lay inside the project goes to the same place under ``code_dir`` (the
    node's restored code, default ``node_dir/code``)."""
    manifest = chunks.load(store, run_id)
    if manifest is None:
        say("the run has no inputs manifest: no inputs placed")
        return None
    base = node_dir / "inputs"
    placed, fetched, kept = [], 0, 0
    owner = {f.path: _owner(f.path, manifest.inputs) for f in manifest.files}
    for root in manifest.inputs:
        path = str(root["path"])
        files = [f for f in manifest.files if owner[f.path] == path]
        if root.get("code_rel"):  # never probed at its path here: the project is not here
            target = str(_inside(code_dir or node_dir / "code", str(root["code_rel"])))
        else:
            target = path if root.get("kind") == "url" else _target(path, files, base)
        for entry in files:
            dest = Path(target) / os.path.relpath(entry.path, path) if entry.path != path \
                else Path(target)
            if _same(dest, entry):
                kept += 1
                continue
            fetched += _write(store, entry, dest)
        placed.append({**root, "placed": target})
        where = "the same path" if target == path else target
        if root.get("code_rel"):
            where = f"code/{root['code_rel']}"
        say(f"input {path}: {len(files)} file(s) at {where} (${root.get('env')})")
    say(f"inputs: {fetched / 1e6:.1f} MB fetched from the store and verified, "
        f"{kept} file(s) already here")
    for left in not_shipped(manifest):
        say(f"warning: the run read {left['path']}, which was not shipped ({left['why']}): "
            "the run here will not find it")
    mapping = {"inputs": placed, "home": manifest.home}
    base.mkdir(parents=True, exist_ok=True)
    (base / PLACED_FILE).write_text(json.dumps(mapping, indent=1, sort_keys=True))
    return mapping


def not_shipped(manifest: chunks.Manifest) -> list[dict[str, str]]:
    """What the run read that is not on this node (its code and hub mirrors aside)."""
    skipped = [s for s in manifest.skipped if s.get("why") not in (names.IN_CODE,)
               and not str(s.get("why", "")).startswith(names.MIRROR)]
    return [*manifest.refused, *skipped]


def _inside(code_dir: Path, rel: str) -> Path:
    """``code_dir/rel``, refusing a ``rel`` from the manifest that climbs out of it."""
    target = (code_dir / rel).resolve()
    if not target.is_relative_to(code_dir.resolve()):
        raise SnapshotError(f"refusing an input placed outside the code: {rel!r}")
    return target


def _owner(file: str, roots: list[dict[str, Any]]) -> str | None:
    """The innermost input holding ``file`` (``~/data/shards`` before ``~/data``)."""
    holding = [str(r["path"]) for r in roots if _belongs(file, str(r["path"]))]
    return max(holding, key=len) if holding else None


def _belongs(file: str, root: str) -> bool:
    return file == root or file.startswith(root.rstrip("/") + "/")


def _target(path: str, files: list[chunks.FileEntry], base: Path) -> str:
    """The same path if this node allows it, else the input's place under ``base``."""
    if _allowed(path, files):
        return path
    return str(base / path.lstrip("/"))


def _allowed(path: str, files: list[chunks.FileEntry]) -> bool:
    for entry in files:
        dest = Path(entry.path)
        if dest.exists() and not _same(dest, entry):
            return False  # the node has a different file there: never overwrite it
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=".burst-probe-"):
                pass
        except OSError:
            return False
    return True


def _same(dest: Path, entry: chunks.FileEntry) -> bool:
    """``dest`` holds the bytes ``entry`` names: by its size and mtime to the nanosecond
    (what burst placed carries the run's mtime), else by hashing it."""
    try:
        st = dest.lstat()
        if dest.is_symlink() or st.st_size != entry.size:
            return False
        if st.st_mtime_ns == entry.mtime_ns and entry.hashed:
            return True
        digest = hashlib.sha256()
        with open(dest, "rb") as existing:
            while block := existing.read(chunks.CHUNK_BYTES):
                digest.update(block)
        return digest.hexdigest() == entry.digest
    except OSError:
        return False


def _write(store: Store, entry: chunks.FileEntry, dest: Path) -> int:
    """Write ``entry`` at ``dest`` from its verified chunks; the bytes fetched."""
    if not entry.hashed:
        raise SnapshotError(f"input {entry.path} was never stored (the run died before it "
                            "staged it): resume from the machine that read it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            for digest in entry.chunks:
                block = chunks.fetch_chunk(store, digest)
                whole.update(block)
                out.write(block)
        if whole.hexdigest() != entry.digest:
            raise SnapshotError(f"input {entry.path}: the chunks in the store do not make "
                                "the file the run read")
        os.chmod(temporary, entry.mode)
        os.utime(temporary, ns=(entry.mtime_ns, entry.mtime_ns))
        os.replace(temporary, dest)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return entry.size


def node_env(node_dir: Path) -> dict[str, str]:
    """What ``burst node run`` exports so the script finds its inputs (empty: none)."""
    mapping_file = node_dir / "inputs" / PLACED_FILE
    try:
        mapping = json.loads(mapping_file.read_text())
    except (OSError, ValueError):
        return {}
    env = {names.MAP_ENV: str(mapping_file)}
    for root in mapping.get("inputs", []):
        if root.get("env"):
            env[str(root["env"])] = str(root["placed"])
        if root.get("hub_env"):
            env[str(root["hub_env"])] = str(root["placed"])
    return env


_MAPS: dict[str, tuple[float, dict[str, Any]]] = {}


def input_path(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str:
    """Where an input of this run lives on this machine.

    On the machine the run read it on, ``path`` itself (absolute); on a node, the copy
    burst placed (the same path where the node allowed it, else under
    ``$BURST_NODE_DIR/inputs``). ``~`` means the home of the machine that read the input,
    so ``burst.input_path("~/data/train.bin")`` finds the data on a node with another home.
    An object-storage URL given as an input is returned as it is."""
    env = os.environ if environ is None else environ
    raw = os.fspath(path)
    mapping_file = env.get(names.MAP_ENV)
    if not mapping_file:
        return raw if "://" in raw else os.path.abspath(os.path.expanduser(raw))
    mapping = _mapping(mapping_file)
    if raw.startswith("~") and mapping.get("home"):
        raw = str(mapping["home"]) + raw[1:]
    if "://" in raw:
        return raw
    absolute = os.path.abspath(os.path.expanduser(raw))
    roots = sorted(mapping.get("inputs", []), key=lambda r: len(str(r["path"])), reverse=True)
    for root in roots:
        if _belongs(absolute, str(root["path"])):
            rest = os.path.relpath(absolute, str(root["path"]))
            return str(root["placed"]) if rest == "." else os.path.join(str(root["placed"]), rest)
    return absolute


def _mapping(mapping_file: str) -> dict[str, Any]:
    try:
        mtime = os.stat(mapping_file).st_mtime
        cached = _MAPS.get(mapping_file)
        if cached is None or cached[0] != mtime:
            _MAPS[mapping_file] = (mtime, json.loads(Path(mapping_file).read_text()))
        return _MAPS[mapping_file][1]
    except (OSError, ValueError):
        return {}

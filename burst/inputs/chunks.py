"""Input files in the store: content-addressed chunks, shared by every run of the store,
and a per-run manifest (JSON, never pickle) that names them.

Each file is cut into fixed-size chunks of :data:`CHUNK_BYTES` (8 MiB), and each chunk is
stored once under ``inputs/chunks/<sha256>``. Fixed-size chunks per file, not
content-defined ones, because of how data sets change: a file is added, replaced or
appended to (a token file grows at its end, a shard is regenerated), and for those a
changed file re-uploads only its own changed chunks while every other file's chunks are
already in the store; content-defined chunking only wins for bytes inserted in the middle
of a large file, which data sets rarely see, and costs a rolling hash over every byte.
Fixed chunks also keep a chunk's place in its file a multiplication, so a node can fetch
and verify them independently, and 8 MiB is one PUT each (no multipart) while a 20 GB
data set stays at a few thousand objects.

The manifest, ``<run>/env/inputs.json``, lists the inputs (where they live here, the
variable a node exports for each), every file (path, size, mode, mtime, whole-file and
chunk digests) and what was not shipped and why. Hashing is the expensive part, so a
file whose size, mtime and inode did not change is not hashed again in this process, and
a *draft* of the manifest (files known by their stat, digests still empty) is written
before any hashing: a run that dies before its inputs are staged still says what it read,
and ``burst resume`` hashes and uploads the rest from the machine that read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from burst.errors import SnapshotError
from burst.inputs.names import SHARED_PREFIX
from burst.store.base import Store

FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
CHUNK_BYTES = 8 << 20
CHUNKS = f"{SHARED_PREFIX}/chunks/"


def chunk_key(digest: str) -> str:
    return f"{CHUNKS}{digest}"


def manifest_key(run_id: str) -> str:
    return f"{run_id}/env/inputs.json"


@dataclass(frozen=True)
class FileEntry:
    """One input file as it was when hashed."""

    path: str  # absolute, on the machine that read it
    size: int
    mode: int
    mtime_ns: int
    digest: str  # sha256 of the whole file
    chunks: tuple[str, ...]  # sha256 of each CHUNK_BYTES piece, in order

    @property
    def hashed(self) -> bool:
        """False for a draft's entry: the file is known by its stat, not yet by its bytes."""
        return bool(self.digest)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        """An entry read from a store (not trusted): an absolute, normal path and
        SHA-256 digests only, so a manifest cannot name ``../`` or an odd store key."""
        path, digests = str(data["path"]), [str(data["digest"]), *map(str, data["chunks"])]
        if not path.startswith("/") or os.path.normpath(path) != path:
            raise ValueError(f"not an absolute, normal path: {path!r}")
        if digests != [""] and not all(_HEX64.fullmatch(d) for d in digests):
            raise ValueError(f"not a SHA-256 digest in the entry of {path!r}")
        return cls(str(data["path"]), int(data["size"]), int(data["mode"]),
                   int(data["mtime_ns"]), str(data["digest"]),
                   tuple(str(c) for c in data["chunks"]))


_HASHED: dict[tuple[str, int, int, int], FileEntry] = {}
_GUARD = threading.Lock()


def stat_key(path: str, st: os.stat_result) -> tuple[str, int, int, int]:
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def known_entry(path: str) -> FileEntry:
    """The file's entry without reading it: hashed if this process hashed it unchanged
    before, else a draft (digest ``""``) that ``burst resume`` completes."""
    st = os.stat(path)
    with _GUARD:
        known = _HASHED.get(stat_key(path, st))
    return known or FileEntry(path, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns, "",
                              ())


def hash_file(path: str) -> FileEntry:
    """The file's entry, hashed now unless this process hashed it unchanged before.
    Follows symbolic links (a hub cache's snapshot links to its blob): the entry holds
    the bytes a reader of ``path`` gets."""
    st = os.stat(path)
    key = stat_key(path, st)
    with _GUARD:
        known = _HASHED.get(key)
    if known is not None:
        return known
    whole, chunks = hashlib.sha256(), []
    with open(path, "rb") as source:
        while block := source.read(CHUNK_BYTES):
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
    entry = FileEntry(path, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns,
                      whole.hexdigest(), tuple(chunks))
    with _GUARD:
        _HASHED[key] = entry
    return entry


def unchanged(entry: FileEntry) -> bool:
    """The file on disk is still what ``entry`` describes (by size and mtime: no read)."""
    try:
        st = os.stat(entry.path)
    except OSError:
        return False
    return st.st_size == entry.size and st.st_mtime_ns == entry.mtime_ns


def stored_chunks(store: Store) -> set[str]:
    """The digests of every chunk the store holds (one listing)."""
    return {key[len(CHUNKS):] for key in store.list(CHUNKS)}


def upload_file(store: Store, entry: FileEntry, known: set[str],
                wait: Any = None) -> int:
    """Put the chunks of ``entry`` the store lacks (``known``: what it holds, updated);
    return the bytes sent. Each chunk is re-read and re-hashed: a file that changed
    since it was hashed is refused rather than stored under a wrong name."""
    sent = 0
    with open(entry.path, "rb") as source:
        for index, digest in enumerate(entry.chunks):
            if digest in known:
                continue
            source.seek(index * CHUNK_BYTES)
            block = source.read(CHUNK_BYTES)
            if hashlib.sha256(block).hexdigest() != digest:
                raise SnapshotError(f"input {entry.path} changed while it was being stored")
            if wait is not None:
                wait(len(block))
            store.put(chunk_key(digest), block)
            known.add(digest)
            sent += len(block)
    return sent


@dataclass
class Manifest:
    """What a run's inputs are: its roots, its files, what was left out and why."""

    inputs: list[dict[str, Any]] = field(default_factory=list)
    files: list[FileEntry] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    mirrors: dict[str, str] = field(default_factory=dict)  # hub mirror variables to forward
    home: str = ""  # this machine's HOME: burst.input_path("~/...") means it on a node

    def to_bytes(self) -> bytes:
        data = {"format": FORMAT, "chunk_bytes": CHUNK_BYTES, "inputs": self.inputs,
                "files": [f.to_json() for f in self.files], "skipped": self.skipped,
                "refused": self.refused, "mirrors": self.mirrors, "home": self.home}
        return json.dumps(data, sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT or data.get("chunk_bytes") != CHUNK_BYTES:
                raise ValueError(f"format {data.get('format')!r}")
            return cls(list(data["inputs"]), [FileEntry.from_json(f) for f in data["files"]],
                       list(data.get("skipped") or []), list(data.get("refused") or []),
                       dict(data.get("mirrors") or {}), str(data.get("home") or ""))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotError(f"the run's inputs manifest is not readable: {exc}") from None

    def missing(self, known: set[str]) -> list[FileEntry]:
        """The files not hashed yet or with a chunk ``known`` lacks."""
        return [f for f in self.files if not f.hashed or any(c not in known for c in f.chunks)]


def save(store: Store, run_id: str, manifest: Manifest) -> None:
    store.put(manifest_key(run_id), manifest.to_bytes())


def load(store: Store, run_id: str) -> Manifest | None:
    """The run's inputs manifest, or None when the run has none."""
    try:
        raw = store.get(manifest_key(run_id))
    except KeyError:
        return None
    return Manifest.from_bytes(raw)


def fetch_chunk(store: Store, digest: str) -> bytes:
    """A chunk from the store, its hash checked (a store is not trusted)."""
    try:
        block = store.get(chunk_key(digest))
    except KeyError:
        raise SnapshotError(f"input chunk {digest[:12]} is not in {store.url}") from None
    if hashlib.sha256(block).hexdigest() != digest:
        raise SnapshotError(f"input chunk {digest[:12]} in {store.url} does not match its hash")
    return block


def reset_cache() -> None:
    with _GUARD:
        _HASHED.clear()

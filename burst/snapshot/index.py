"""Index files: a sharded manifest's tensor table, stored beside it in parts.

A format 2 (or 4) manifest that lists every shard inline counts every shard against the
manifest caps (``MAX_MANIFEST_ENTRIES``, ``MAX_MANIFEST_BYTES``): a 1,024-rank FSDP run of
a few hundred tensors, or a mixture-of-experts model on four ranks, is past them. So a
sharded snapshot committed by :func:`burst.snapshot.parts.commit_parts` keeps its tensor
table in *index files* instead:

- each index file is a manifest-shaped JSON document (``"kind": "index"``, an empty
  ``state``) holding some of the tensors, whole, with every shard of each, and the
  ``blobs`` records those shards point at. It is parsed and checked by
  :func:`burst.snapshot.format.parse_manifest` like any manifest (the same caps, per
  file; shards that tile each tensor exactly), so a tensor's shards never straddle two
  files and each file is checkable alone;
- an index file is stored as a content-addressed blob of the run (named by the
  snapshot's hash): written before the manifest, read whole and checked against its name
  like any blob, kept by GC like any blob the snapshot references, copied by push and
  pull like one;
- the manifest lists the index files' digests in ``"indexes"`` and their sizes in its own
  ``"blobs"``; its ``"tensors"`` is empty. The caps count index files, not shards: up to
  ``MAX_MANIFEST_ENTRIES`` files of up to ``SHARDS_PER_INDEX`` shards each.

Readers see none of it: :func:`burst.snapshot.reader.read_manifest` reads the index files
and returns the manifest *expanded* (:func:`expand`: its ``tensors`` and ``blobs`` as an
inline manifest has them, plus the index files among the blobs), so listing, verifying,
pushing, pulling and restoring work on it unchanged. A manifest without ``"indexes"``
(every format 2 manifest written before this) is read as it always was.

Commit order: blobs (each rank's), then index files, then the manifest
(:mod:`burst.snapshot.commit` lands the index files as the commit's own blobs), so a
snapshot is still complete or invisible. No pickle: JSON throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from burst.errors import SnapshotError
from burst.snapshot import format as fmt

INDEX_KIND = "index"
# Shards per index file: ~170 bytes each encoded (10 MB a file, well under the byte cap),
# three JSON containers each (well under the container cap), and few enough that
# parsing one file stays a fraction of a second.
SHARDS_PER_INDEX = 50_000
# All of one snapshot's index files together, checked by their declared sizes before any
# is read: a 1,024-rank run of 1,000 tensors (a million shards) is ~170 MB.
MAX_INDEX_BYTES = 1 << 30


def encode_files(fields: Mapping[str, Any], run_id: str, step: int, tensors: dict[str, dict],
                 blobs: dict[str, dict], algo: str) -> list[tuple[str, bytes]]:
    """The index files of a merged tensor table: (digest by ``algo``, bytes) each.

    ``fields`` are the manifest's ``format``/``hash`` fields. Tensors go in name order,
    a file closed when the next tensor's shards would take it past ``SHARDS_PER_INDEX``."""
    files = []
    for group in _groups(tensors, SHARDS_PER_INDEX):
        used = sorted({shard["blob"] for entry in group.values()
                       for shard in fmt.entry_shards(entry)})
        doc = {**fields, "kind": INDEX_KIND, "run_id": run_id, "step": step, "state": {},
               "tensors": group, "blobs": {digest: blobs[digest] for digest in used}}
        data = fmt.encode_manifest(doc)
        files.append((fmt.digest(data, algo), data))
    return files


def _groups(tensors: dict[str, dict], per_file: int) -> list[dict[str, dict]]:
    groups: list[dict[str, dict]] = []
    current: dict[str, dict] = {}
    count = 0
    for name in sorted(tensors):
        entry = tensors[name]
        shards = len(entry["shards"]) if fmt.is_sharded(entry) else 1
        if current and count + shards > per_file:
            groups.append(current)
            current, count = {}, 0
        current[name] = entry
        count += shards
    if current:
        groups.append(current)
    return groups


def listed(manifest: dict, source: str) -> list[str]:
    """The digests of the index files a parsed manifest lists (none: ``[]``), checked:
    each a blob of the manifest, once, their declared sizes within ``MAX_INDEX_BYTES``."""
    digests = manifest.get("indexes")
    if digests is None:
        return []
    blobs = manifest["blobs"]
    if (not isinstance(digests, list) or manifest.get("format") not in fmt.SHARDED_VERSIONS
            or not all(isinstance(d, str) and d in blobs for d in digests)
            or len(set(digests)) != len(digests)):
        raise SnapshotError(f"{source} has a malformed 'indexes' field (each must be one of "
                            "its blobs, once, in a sharded format)")
    total = sum(blobs[d]["size"] for d in digests)
    if total > MAX_INDEX_BYTES:
        raise SnapshotError(f"{source} lists {total} bytes of index files: more than any real "
                            f"snapshot (at most {MAX_INDEX_BYTES >> 20} MiB)")
    return digests


def parse(data: bytes | bytearray, manifest: dict, digest: str, source: str) -> dict:
    """One index file's bytes (already checked against ``digest``) as a parsed tensor
    table of ``manifest``'s snapshot: same run, step, format and hash."""
    what = f"{source}: index file {digest[:12]}"
    doc = fmt.parse_manifest(bytes(data), run_id=manifest["run_id"], step=manifest["step"],
                             source=what)
    if (doc.get("kind") != INDEX_KIND or doc["state"] or "indexes" in doc
            or doc["format"] != manifest["format"]
            or fmt.hash_of(doc) != fmt.hash_of(manifest)):
        raise SnapshotError(f"{what} is not an index file of this snapshot")
    return doc


def expand(manifest: dict, files: list[dict]) -> dict:
    """``manifest`` with the tensor tables of its parsed index ``files`` (in ``indexes``
    order) merged in: each tensor in exactly one file, each blob described alike by
    every file that lists it."""
    tensors = dict(manifest["tensors"])
    blobs = dict(manifest["blobs"])
    for digest, doc in zip(manifest.get("indexes", []), files, strict=True):
        for name, entry in doc["tensors"].items():
            if name in tensors:
                raise SnapshotError(f"tensor {name!r} is listed twice in snapshot "
                                    f"{manifest['run_id']}@{manifest['step']} (again in index "
                                    f"file {digest[:12]})")
            tensors[name] = entry
        for blob, info in doc["blobs"].items():
            if blobs.setdefault(blob, info) != info:
                raise SnapshotError(f"index file {digest[:12]} of snapshot "
                                    f"{manifest['run_id']}@{manifest['step']} describes blob "
                                    f"{blob[:12]} unlike another")
    return {**manifest, "tensors": tensors, "blobs": blobs}

"""A sharded snapshot of many tensors or many ranks, written at planner level (no
training): ``python -m tests.snapshot.index_scale ROLE STORE RANKS TENSORS [RESHARD EVERY]``.

Every tensor is ``(2 * RANKS, 2)`` float32 cut into one row pair per rank (FSDP2's
row layout), written through the sharded path's own functions
(:func:`burst.snapshot.parts.write_part`, :func:`~burst.snapshot.parts.commit_parts`).

- ``others``: ranks 1..RANKS-1 write their parts (one process plays them all);
- ``rank0``: rank 0 writes its part, commits, lists, verifies, and restores its own share
  of every tensor at the saved world size and of every ``EVERY``-th tensor at ``RESHARD``
  ranks (each region then spans two writers' shards), then prints one JSON
  line of figures: its peak RSS (``VmHWM``), the manifest's and index files' sizes, and
  how long each stage took (reported, never asserted).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from burst.parallel import reshard
from burst.snapshot import catalog, reader
from burst.snapshot import format as fmt
from burst.snapshot.parts import Box, commit_parts, write_part
from burst.store.local import LocalStore

RUN, STEP = "run", 7
COLUMNS = 2


def names(tensors: int) -> list[str]:
    return [f"state/model/layer{i:07d}.weight" for i in range(tensors)]


def values(tensors: int, rows: int) -> torch.Tensor:
    """Every tensor's whole value, stacked (exact in float32 up to 2**24 elements)."""
    return torch.arange(tensors * rows * COLUMNS, dtype=torch.float32).reshape(
        tensors, rows, COLUMNS)


def write(store: LocalStore, rank: int, ranks: int, tensors: int) -> None:
    rows = 2 * ranks
    mine = values(tensors, rows)[:, 2 * rank : 2 * rank + 2]
    pieces = {name: mine[i] for i, name in enumerate(names(tensors))}  # contiguous views
    boxes = {name: Box((rows, COLUMNS), (2 * rank, 0)) for name in pieces}
    write_part(store, RUN, STEP, rank, pieces, boxes, world_size=ranks)


def tree(tensors: int) -> dict:
    return {"model": {name: {"$tensor": name} for name in names(tensors)}}


def peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def rank0(store: LocalStore, ranks: int, tensors: int, reshard_to: int,
          reshard_every: int) -> dict:
    figures: dict = {}
    started = time.perf_counter()
    write(store, 0, ranks, tensors)
    figures["part_s"] = time.perf_counter() - started
    started = time.perf_counter()
    committed = commit_parts(store, RUN, STEP, ranks, tree=tree(tensors),
                             meta={"reason": "periodic"}, timeout=600)
    assert committed is not None
    figures["commit_s"] = time.perf_counter() - started
    del committed
    raw = store.get(fmt.manifest_key(RUN, STEP))
    listed = json.loads(raw)["indexes"]
    figures.update(manifest_bytes=len(raw), index_files=len(listed),
                   index_bytes=sum(store.size(fmt.blob_key(RUN, d)) or 0 for d in listed))
    started = time.perf_counter()
    rows_listed = catalog.snapshot_rows(store, RUN)  # what `burst ls RUN` prints
    figures["list_s"] = time.perf_counter() - started
    assert [row["step"] for row in rows_listed] == [STEP]
    started = time.perf_counter()
    manifest = reader.verify(store, RUN, STEP)
    figures["verify_s"] = time.perf_counter() - started
    figures["shards"] = sum(len(fmt.entry_shards(e)) for e in manifest["tensors"].values())
    rows = 2 * ranks
    every = names(tensors)
    for label, world, sample in (("restore", ranks, 1), ("reshard", reshard_to, reshard_every)):
        share = -(-rows // world)  # rank 0's rows at that world size
        started = time.perf_counter()
        read = reshard.read_plan(store, manifest, {name: ((0, 0), (share, COLUMNS))
                                                   for name in every[::sample]})
        figures[f"{label}_s"] = time.perf_counter() - started
        figures[f"{label}_tensors"] = len(read)
        whole = values(tensors, rows)
        for index in range(0, tensors, sample):
            assert torch.equal(read[every[index]], whole[index, :share]), every[index]
        del read, whole
    figures["peak_rss_mib"] = peak_rss_kib() / 1024
    return figures


def main() -> None:
    role, root, ranks, tensors = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = LocalStore(root)
    if role == "others":
        for rank in range(1, ranks):
            write(store, rank, ranks, tensors)
        return
    print(json.dumps(rank0(store, ranks, tensors, int(sys.argv[5]), int(sys.argv[6]))))


if __name__ == "__main__":
    main()

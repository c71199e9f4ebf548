"""Read a snapshot into the layout this rank has now, whatever layout wrote it.

A snapshot describes each tensor by its global shape (format 2 lists the boxes that
cover it, format 1 one whole range), so the restoring run, not the saving one, decides
how state is cut: N ranks of FSDP2 restore into M ranks, into DDP, or into one process.

For a sharded live model (DTensor parameters) each rank reads only its own box of every
sharded tensor (:func:`burst.snapshot.shards.read_region`) and wraps it as a DTensor
placed like the live one, loaded by the modules' and optimizer's own ``load_state_dict``
(:func:`burst.parallel.sharded.load`).
Optimizer state follows its parameter: a state tensor with the parameter's global shape
is cut like the parameter; anything else (a step counter) is read whole, as is
everything that is not sharded (buffers, scheduler, scaler, generators, extra). A model
that is not sharded (one process, DDP) reads every tensor whole.

Memory: a sharded rank holds its own boxes (as big as its live shards: the decoded state
exists beside the live one until it is copied in) plus staging, never a full sharded
tensor of format 2. Staging (:mod:`burst.snapshot.shards`), for each of the
``TENSORS_AT_ONCE`` regions read at once: the row spans of the shards the region meets (at
most ``shards.WORKERS`` at once, each at most one shard's bytes plus two ``CHUNK_BYTES`` of
widening for verification); plus the cache of whole blobs without
chunk hashes (at most ``shards.CACHE_BYTES``). A blob without chunk hashes is read whole
because only its digest can verify it: for a format 1 snapshot that is one whole tensor
per region in flight (its own blob), so restoring format 1 is bounded by the largest
few tensors, not by the shard.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from burst.parallel.group import Group
from burst.snapshot import shards
from burst.snapshot import tensors as tensors_mod
from burst.state import capture as state_mod
from burst.store.base import Store

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) per dimension
TENSORS_AT_ONCE = 4  # regions read at once by :func:`read_plan`


@dataclass(frozen=True)
class Ref:
    """A tensor of the snapshot by name and global shape, standing in for it before any
    byte is read (to check the snapshot and plan the reads)."""

    name: str
    shape: tuple[int, ...]


def load_rank_state(store: Store, manifest: dict, components: state_mod.Components,
                    group: Group, *, verified: bool = False) -> dict[str, Any]:
    """The decoded state of ``manifest`` for this rank (as :func:`burst.state.capture.decode`
    gives), with the live model's sharded tensors as this rank's DTensor shards.

    Every rank of ``group`` calls this with the same manifest; which box is this rank's
    comes from the live DTensors, so no collective is needed. ``verified``: this process
    has just checked the blobs' hashes in ``store``. A snapshot that does not fit a
    sharded model is refused before any tensor is read."""
    if not _sharded(components):
        tensors = tensors_mod.load_tensors(store, manifest, verified=verified)
        return state_mod.decode(manifest, tensors)
    from burst.parallel import sharded as dcp

    skeleton = state_mod.decode(manifest, refs(manifest))
    assert components.model is not None  # _sharded() found DTensors in it
    dcp.check(components.model, components.optimizer, skeleton.get("model"),
              skeleton.get("optimizer"))
    targets = {ref.name: live for ref, live in dcp.sharded_counterparts(
        components.model, components.optimizer, skeleton["model"],  # check() refused none
        skeleton.get("optimizer"))}
    plan: dict[str, Box | None] = {ref.name: None for ref in _refs_in(skeleton)}
    plan.update({name: dcp.local_box(live) for name, live in targets.items()})
    read = read_plan(store, manifest, plan, verified=verified)
    for name, live in targets.items():
        read[name] = dcp.like(read[name], live)
    return state_mod.decode(manifest, read)


def _sharded(components: state_mod.Components) -> bool:
    """Whether the live model has DTensor parameters (only with a process group)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return False
    from burst.parallel import sharded as dcp

    return dcp.is_sharded(components.model)


def refs(manifest: dict) -> dict[str, Ref]:
    """A :class:`Ref` for every tensor the manifest holds."""
    return {name: Ref(name, tuple(entry["shape"])) for name, entry in manifest["tensors"].items()}


def _refs_in(value: Any) -> list[Ref]:
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs_in(v)]
    if isinstance(value, list | tuple):
        return [r for v in value for r in _refs_in(v)]
    return []


def read_plan(store: Store, manifest: dict, plan: dict[str, Box | None], *,
              verified: bool = False) -> dict[str, torch.Tensor]:
    """Each planned tensor: its box as a new contiguous CPU tensor, or the whole tensor
    for None. One blob cache for all of them, so a pack of small tensors without chunk
    hashes is read (and hashed) once, not once per tensor."""
    cache = shards.BlobCache(check_hash=not verified)

    def read(item: tuple[str, Box | None]) -> torch.Tensor:
        name, box = item
        if box is None:
            return shards.read_whole(store, manifest, name, blobs=cache)
        return shards.read_region(store, manifest, name, box[0], box[1], blobs=cache)

    def read_each(items: list[tuple[str, Box | None]]) -> list[torch.Tensor]:
        return [read(item) for item in items]

    # Several tensors at once, dealt round-robin (a few futures however many tensors):
    # one tensor's reads and hashes (the GIL let go) overlap the next one's, instead of a
    # region's few shards being all the work in flight.
    items = list(plan.items())
    lanes = [items[k::TENSORS_AT_ONCE] for k in range(min(TENSORS_AT_ONCE, len(items)))]
    if len(lanes) <= 1:
        return {name: tensor for lane in lanes
                for (name, _), tensor in zip(lane, read_each(lane), strict=True)}
    with ThreadPoolExecutor(len(lanes), thread_name_prefix="burst-reshard") as pool:
        done = dict(zip((name for lane in lanes for name, _ in lane),
                        (t for tensors in pool.map(read_each, lanes) for t in tensors),
                        strict=True))
    return {name: done[name] for name in plan}

"""Each rank's own piece of the training state, for a sharded snapshot (format 2).

Every rank calls :func:`capture_rank` at the same step boundary (it is a collective). It
returns the state tree, the tensors *this rank* writes, and where each lies in its global
tensor (:class:`burst.snapshot.parts.Box`); :mod:`burst.snapshot.parts` writes them.

- The names are a whole snapshot's: the model under ``state/model/<parameter name>`` (no
  wrapper prefixes), the optimizer keyed by parameter index (:func:`sharded.by_index`),
  so a sharded snapshot restores wherever a whole one does, and the reverse.
- A sharded model (FSDP2, DTensor) is read with DCP's state-dict API *without* gathering
  (``full_state_dict=False``): each DTensor gives its local shard and that shard's box.
  A DTensor replicated over some mesh dimensions (HSDP) is written by the replica at
  coordinate 0 of those dimensions only, so every element is written exactly once.
- A plain tensor (all of a DDP model, buffers, an optimizer's ``step``) is the same on
  every rank and is written by one of them, chosen by :func:`owners`: a deterministic
  greedy balance of bytes, so every rank computes the same choice without talking.
- Rank 0 also writes everything that is not the model's or optimizer's: scheduler, scaler,
  ``extra``, its own generators and every rank's (``rng_ranks``, gathered as today).

The tree on rank 0 is the one the manifest gets, exactly the tree a whole snapshot of the
same state has. The other ranks' trees hold only ``model`` and ``optimizer`` (the same as
rank 0's): the rest is rank 0's alone.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

import torch

from burst.errors import ConfigError
from burst.parallel.group import Group
from burst.snapshot import tree
from burst.snapshot.parts import Box
from burst.state import capture as state_mod
from burst.state import rank_rng, rng

_SHARED = ("model", "optimizer")  # the parts of the tree every rank encodes


def capture_rank(components: state_mod.Components, extra: dict, group: Group
                 ) -> tuple[dict, dict[str, torch.Tensor], dict[str, Box]]:
    """(tree, tensors this rank writes, their boxes); a collective on several ranks."""
    if not group.collective:  # one process: a whole snapshot, every tensor whole
        state_tree, tensors = state_mod.capture(components, extra)
        return state_tree, tensors, {name: Box.whole(t) for name, t in tensors.items()}
    rng_states = group.gather_json(rank_rng.to_json(rng.capture()))
    model_state, optim_state = _model_and_optimizer(components)
    shared: dict[str, torch.Tensor] = {}
    state_tree = {"model": tree.encode(model_state, "state/model", shared),
                  "optimizer": tree.encode(optim_state, "state/optimizer", shared)}
    tensors, boxes = _own_pieces(shared, group)
    if group.is_writer:
        assert rng_states is not None  # rank 0 gathers them
        rest = replace(components, model=None, optimizer=None)
        rest_tree, rest_tensors = state_mod.capture(rest, extra)
        ranks = [rng.storable(rank_rng.from_json(s)) for s in rng_states]
        rest_tree["rng_ranks"] = tree.encode(ranks, "state/rng_ranks", rest_tensors)
        state_tree = {**rest_tree, **state_tree}
        tensors.update(rest_tensors)
        boxes.update({name: Box.whole(t) for name, t in rest_tensors.items()})
    return state_tree, tensors, boxes


def _model_and_optimizer(components: state_mod.Components) -> tuple[Any, Any]:
    """The model and optimizer state as a whole snapshot names them; sharded tensors stay
    DTensors (nothing is gathered)."""
    from burst.parallel import sharded as dcp  # a process group runs: DCP can load

    model, optimizer = components.model, components.optimizer
    if model is None:
        return None, None if optimizer is None else optimizer.state_dict()
    if not dcp.is_sharded(model):  # replicated (DDP): the model is already unwrapped
        return model.state_dict(), None if optimizer is None else optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )

    options = StateDictOptions(full_state_dict=False)
    if optimizer is None:
        return get_model_state_dict(model, options=options), None
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return model_state, dcp.by_index(optim_state)


def _own_pieces(shared: dict[str, torch.Tensor], group: Group
                ) -> tuple[dict[str, torch.Tensor], dict[str, Box]]:
    """This rank's share of the model and optimizer tensors, with their boxes."""
    from torch.distributed.tensor import DTensor

    tensors: dict[str, torch.Tensor] = {}
    boxes: dict[str, Box] = {}
    plain: dict[str, int] = {}
    for name, value in shared.items():
        if isinstance(value, DTensor) and value.numel() > 0:
            piece = _local_piece(name, value)
            if piece is not None:
                tensors[name], boxes[name] = piece
        else:
            plain[name] = value.numel() * value.element_size()
    mine = owners(plain, group.world_size)
    for name in plain:
        if mine[name] == group.rank:
            value = shared[name]
            if isinstance(value, DTensor):  # empty: nothing to gather
                value = torch.empty(value.shape, dtype=value.dtype)
            tensors[name], boxes[name] = value, Box.whole(value)
    return tensors, boxes


def _local_piece(name: str, value: Any) -> tuple[torch.Tensor, Box] | None:
    """A DTensor's local shard and its box, or None when this rank is not the one that
    writes it (an empty shard, or a replica other than the first)."""
    placements = value.placements
    if any(p.is_partial() for p in placements):
        raise ConfigError(f"tensor {name!r} is a partial sum across ranks (DTensor Partial): "
                          "reduce it before a snapshot")
    coordinate = value.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is outside the tensor's mesh
        return None
    if any(p.is_replicate() and c != 0 for p, c in zip(placements, coordinate, strict=True)):
        return None
    local = value.to_local()
    if local.numel() == 0:  # FSDP2's last ranks when dim 0 is shorter than the world
        return None
    chunks = value.__create_chunk_list__()
    if len(chunks) != 1:
        raise ConfigError(f"tensor {name!r}'s local shard is {len(chunks)} pieces of the "
                          "global tensor, not one box: burst snapshots row- or block-sharded "
                          "DTensors (FSDP2, tensor parallel), not interleaved layouts")
    offsets, sizes = tuple(chunks[0].offsets), tuple(chunks[0].sizes)
    if sizes != tuple(local.shape):
        raise ConfigError(f"tensor {name!r}'s local shard is {tuple(local.shape)}, its box "
                          f"{sizes}: a padded or strided layout burst cannot store")
    return local, Box(tuple(value.shape), offsets)


def owners(nbytes: dict[str, int], world_size: int) -> dict[str, int]:
    """The rank that writes each replicated tensor: largest first (ties by name), each to
    the rank with the fewest bytes so far (ties: the lowest rank). Every rank computes the
    same answer from the same names and sizes."""
    loads = [(0, rank) for rank in range(world_size)]  # a heap: (bytes so far, rank)
    chosen: dict[str, int] = {}
    for name in sorted(nbytes, key=lambda n: (-nbytes[n], n)):
        load, rank = loads[0]
        chosen[name] = rank
        heapq.heapreplace(loads, (load + nbytes[name], rank))
    return chosen

"""Capture and restore for a run on any number of ranks (the run calls these, not
:mod:`burst.state` directly).

One process: exactly :mod:`burst.state`, a whole snapshot (format 1). Several ranks
(DDP or FSDP2): a sharded snapshot (format 2), every rank writing its own piece
(:mod:`burst.parallel.pieces`, :mod:`burst.snapshot.parts`): a DTensor's local shard, its
share of the replicated tensors, and on rank 0 the rest (scheduler, scaler, every rank's
random generators). Nothing is gathered to one rank.

Every rank calls :func:`capture` at the same step boundary (the run agrees on it first),
so the pieces are one consistent step.
On restore each rank reads the same snapshot (rank 0 chose the step) with :func:`load`
and takes its own generators; a sharded model reads only its own shards of each tensor
(:mod:`burst.parallel.reshard`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from burst.parallel.group import Group
from burst.snapshot import tree
from burst.snapshot.parts import Box
from burst.state import capture as state_mod
from burst.state import rank_rng
from burst.store.base import Store


def sharded(components: state_mod.Components) -> bool:
    """Whether the model is sharded (only possible with a process group running)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return False
    from burst.parallel import sharded as dcp

    return dcp.is_sharded(components.model)


def capture(components: state_mod.Components, extra: dict, group: Group
            ) -> tuple[dict, dict[str, torch.Tensor], dict[str, Box] | None]:
    """The state this rank writes: (JSON tree, tensors, boxes).

    On several ranks every rank writes its own piece of a sharded snapshot
    (:func:`burst.parallel.pieces.capture_rank`: a collective; ``boxes`` says where each
    tensor lies in its global one). One process writes a whole snapshot (``boxes`` None);
    a sharded model on a world of one is gathered into it."""
    if group.collective:
        from burst.parallel import pieces

        return pieces.capture_rank(components, extra, group)
    if not sharded(components):
        state_tree, tensors = state_mod.capture(components, extra)
        return state_tree, tensors, None
    from burst.parallel import sharded as dcp

    assert components.model is not None  # sharded() found DTensors in it
    full_model, full_optim = dcp.full_state(components.model, components.optimizer)
    local = replace(components, model=None, optimizer=None)
    state_tree, tensors = state_mod.capture(local, extra)
    state_tree["model"] = tree.encode(full_model, "state/model", tensors)
    state_tree["optimizer"] = tree.encode(full_optim, "state/optimizer", tensors)
    return state_tree, tensors, None


def newest_manifest(group: Group, newest: Callable[[], dict | None],
                    at_step: Callable[[int], dict | None]) -> dict | None:
    """The newest snapshot, the same one on every rank: rank 0 finds it with ``newest``
    and tells the others its step, which they read with ``at_step``."""
    if not group.collective:
        return newest()
    chosen = newest() if group.is_writer else None
    step = group.broadcast_json(None if chosen is None else chosen["step"])
    if group.is_writer or step is None:
        return chosen
    return at_step(step)


def load(store: Store, manifest: dict, components: state_mod.Components, group: Group, *,
         verified: bool = False) -> dict:
    """This rank's decoded state of ``manifest`` for :func:`restore`, reading only what it
    needs (:func:`burst.parallel.reshard.load_rank_state`). ``verified``: this process has
    just checked the blobs' hashes in ``store``."""
    from burst.parallel import reshard

    return reshard.load_rank_state(store, manifest, components, group, verified=verified)


def restore(components: state_mod.Components, saved: dict, group: Group, *, saved_amp: str | None,
            amp: str | None, seed: int, step: int, saved_world_size: int) -> list[str]:
    """Check, then apply a decoded snapshot (:func:`load`) on this rank; return notes on
    what changed. A sharded model takes this rank's DTensor shards as they are, or cuts
    full tensors (a state decoded whole) into its shards."""
    state = dict(saved)
    state["rng"], derived_seed = rank_rng.for_rank(saved, group.rank, seed, step)
    is_sharded = sharded(components)
    if is_sharded:
        from burst.parallel import sharded as dcp

        assert components.model is not None  # sharded() found DTensors in it
        dcp.check(components.model, components.optimizer, saved.get("model"),
                  saved.get("optimizer"))
        local = replace(components, model=None, optimizer=None)
        notes = state_mod.restore(local, state, saved_amp=saved_amp, amp=amp)
        dcp.load(components.model, components.optimizer, saved["model"], saved.get("optimizer"))
    else:
        notes = state_mod.restore(components, state, saved_amp=saved_amp, amp=amp)
    if derived_seed is not None:
        rank_rng.seed_cuda(derived_seed)
    return notes + _world_notes(saved_world_size, group, derived_seed)


def _world_notes(saved_world_size: int, group: Group, derived_seed: int | None) -> list[str]:
    if saved_world_size == group.world_size:
        return []
    notes = [f"world size {saved_world_size} -> {group.world_size}"]
    if derived_seed is not None:
        notes.append(f"rank {group.rank}'s random generators re-created from the snapshot "
                     "(the saved run had no such rank)")
    elif group.is_writer and saved_world_size > group.world_size:
        notes.append(f"the random generators of ranks {group.world_size}.."
                     f"{saved_world_size - 1} are not continued")
    return notes

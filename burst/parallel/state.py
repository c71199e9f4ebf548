"""Capture and restore for a run on any number of ranks (the run calls these, not
:mod:`burst.state` directly).

One process: exactly :mod:`burst.state`. Several ranks:

- **DDP** (replicated state): rank 0 captures the model (unwrapped, so the keys match a
  single-process snapshot), optimizer, scheduler and scaler; every rank contributes only
  its random generators (:mod:`burst.rank_rng`).
- **Sharded** (FSDP2, DTensor): every rank takes part in gathering the full model and
  optimizer state to rank 0 (:mod:`burst.dcp`); the rest is as under DDP.

Every rank calls :func:`capture` at the same step boundary (the run agrees on it first),
so the gathered state is one consistent step. Only rank 0 gets a state to write.
On restore each rank reads the same snapshot (rank 0 chose the step) and takes its own
generators; a sharded model cuts the full tensors into its own shards.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from burst.parallel.group import Group
from burst.snapshot import reader as snapshot
from burst.snapshot import sync
from burst.state import capture as state_mod
from burst.state import rank_rng, rng, tree
from burst.store.base import Store


def sharded(components: state_mod.Components) -> bool:
    """Whether the model is sharded (only possible with a process group running)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return False
    from burst.parallel import sharded as dcp

    return dcp.is_sharded(components.model)


def capture(components: state_mod.Components, extra: dict, group: Group
            ) -> tuple[dict, dict[str, torch.Tensor]] | None:
    """The state to write as (JSON tree, tensors) on rank 0; None on the other ranks."""
    if not group.collective and not sharded(components):
        return state_mod.capture(components, extra)
    rng_states = group.gather_json(rank_rng.to_json(rng.capture()))
    full_model = full_optim = None
    is_sharded = sharded(components)
    if is_sharded:
        from burst.parallel import sharded as dcp

        full_model, full_optim = dcp.full_state(components.model, components.optimizer)
    if not group.is_writer or rng_states is None:
        return None
    local = components if not is_sharded else state_mod.Components(
        None, None, components.scheduler, components.scaler)
    state_tree, tensors = state_mod.capture(local, extra)
    if is_sharded:
        state_tree["model"] = tree.encode(full_model, "state/model", tensors)
        state_tree["optimizer"] = tree.encode(full_optim, "state/optimizer", tensors)
    ranks = [rng.storable(rank_rng.from_json(s)) for s in rng_states]  # keys as blobs
    state_tree["rng_ranks"] = tree.encode(ranks, "state/rng_ranks", tensors)
    return state_tree, tensors


def newest_manifest(group: Group, newest: Callable[[], dict | None],
                    at_step: Callable[[int], dict]) -> dict | None:
    """The newest snapshot, the same one on every rank: rank 0 finds it with ``newest``
    and tells the others its step, which they read with ``at_step``."""
    if not group.collective:
        return newest()
    chosen = newest() if group.is_writer else None
    step = group.broadcast_json(None if chosen is None else chosen["step"])
    if group.is_writer or step is None:
        return chosen
    return at_step(step)


def manifest_at(local: Store, remote: Store, run_id: str, step: int) -> dict:
    """Snapshot ``step`` from the local tier, pulled from ``remote`` first if this node
    lacks it (another node's rank 0 chose it). Pulls are safe to run side by side: blobs
    are content-addressed and every write lands by an atomic rename."""
    if remote is not local and step not in snapshot.list_steps(local, run_id):
        sync.pull(remote, local, run_id, step=step)
    manifest = snapshot.read_manifest(local, run_id, step)
    assert manifest is not None  # read_manifest raises for a missing step
    return manifest


def restore(components: state_mod.Components, saved: dict, group: Group, *, saved_amp: str | None,
            amp: str | None, seed: int, step: int, saved_world_size: int) -> list[str]:
    """Check, then apply a decoded snapshot on this rank; return notes on what changed."""
    state = dict(saved)
    state["rng"], derived_seed = rank_rng.for_rank(saved, group.rank, seed, step)
    is_sharded = sharded(components)
    if is_sharded:
        from burst.parallel import sharded as dcp

        dcp.check(components.model, components.optimizer, saved.get("model"),
                  saved.get("optimizer"))
        local = state_mod.Components(None, None, components.scheduler, components.scaler)
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

"""Sharded models (FSDP2 ``fully_shard``, DTensor parameters) in and out of burst's format.

``torch.distributed.checkpoint`` (DCP) knows how to gather a sharded model and its
optimizer into full tensors, and how to cut full tensors back into whatever shards the
live model has. Its own file format pickles its metadata, so burst does not use it;
instead it uses DCP's state-dict API and stores the *full* (unsharded) state in burst's
format, in exactly the layout of a single-process snapshot:

- the model state is keyed by the plain parameter names (no wrapper prefixes);
- the optimizer state is keyed by parameter index, as ``optimizer.state_dict()`` gives.

So a snapshot from 2 FSDP ranks restores into 1 plain process, 4 FSDP ranks, or DDP,
and a single-process snapshot restores into FSDP: the layout of the shards is chosen
by the restoring run, not recorded in the snapshot.

Cost: a snapshot gathers the full state into rank 0's host memory (``cpu_offload``), and
a restore has every rank read the full state before keeping its shard. That bounds the
model to what one host's RAM holds; writing each rank's shard separately is the way past
that limit and is not done yet.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from burst.errors import ConfigError, SnapshotError

WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.",
                    "module.")


def is_sharded(model: torch.nn.Module | None) -> bool:
    """Whether the model's parameters are DTensors (FSDP2, tensor parallel)."""
    if model is None:
        return False
    _refuse_fsdp1(model)
    return any(isinstance(p, DTensor) for p in model.parameters())


def _refuse_fsdp1(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise ConfigError("burst snapshots FSDP2 (torch.distributed.fsdp.fully_shard) models; "
                          "the older FullyShardedDataParallel wrapper is not supported")


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
               ) -> tuple[dict | None, dict | None]:
    """The full model and optimizer state on rank 0's CPU (None elsewhere); a collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:
        model_state, optim_state = get_model_state_dict(model, options=options), None
    else:
        model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if torch.distributed.get_rank() != 0:
        return None, None
    return model_state, None if optim_state is None else by_index(optim_state)


def by_index(state: dict[str, Any]) -> dict[str, Any]:
    """DCP's optimizer state (keyed by parameter name) keyed by index, as a plain
    ``optimizer.state_dict()`` is: indices number the parameters group by group."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        names = list(group["params"])
        base = len(index)
        index.update({name: base + i for i, name in enumerate(names)})
        groups.append({**group, "params": [index[n] for n in names]})
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": groups}


def by_name(state: dict[str, Any], model: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The inverse of :func:`by_index` for the live ``optimizer``'s parameter order."""
    names = param_names(model)
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**group, "params": [ordered[i] for i in group["params"]]}
              for group in state["param_groups"]]
    return {"state": {ordered[i]: value for i, value in state["state"].items()},
            "param_groups": groups}


def param_names(model: torch.nn.Module) -> dict[int, str]:
    """Parameter object id -> its name without wrapper prefixes."""
    return {id(p): clean_name(name) for name, p in model.named_parameters(remove_duplicate=False)}


def clean_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def check(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
          saved_model: dict | None, saved_optim: dict | None) -> None:
    """Refuse a snapshot that does not fit, before anything is changed (no collective:
    a DTensor's shape is the full one)."""
    if saved_model is None:
        raise SnapshotError("the snapshot holds no model state")
    live = {clean_name(k): tuple(v.shape) for k, v in model.state_dict().items()}
    for name in live.keys() ^ saved_model.keys():
        where = "lacks" if name in live else "has, the model does not,"
        raise SnapshotError(f"the snapshot {where} model tensor {name!r}")
    for name, shape in live.items():
        stored = saved_model[name]
        if not isinstance(stored, torch.Tensor) or tuple(stored.shape) != shape:
            raise SnapshotError(f"model tensor {name!r} does not match the snapshot's")
    if optimizer is not None and saved_optim is not None:
        count = sum(len(g["params"]) for g in optimizer.param_groups)
        saved = sum(len(g.get("params", [])) for g in saved_optim.get("param_groups", []))
        if len(saved_optim.get("param_groups", [])) != len(optimizer.param_groups) or saved != count:
            raise SnapshotError(f"the snapshot's optimizer holds {saved} parameters, "
                                f"this one {count}")


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
         saved_model: dict, saved_optim: dict | None) -> None:
    """Cut the full state into the live model's shards (each rank keeps its own)."""
    options = StateDictOptions(full_state_dict=True, strict=True)
    if optimizer is None or saved_optim is None:
        set_model_state_dict(model, saved_model, options=options)
        return
    set_state_dict(model, optimizer, model_state_dict=saved_model,
                   optim_state_dict=by_name(saved_optim, model, optimizer), options=options)

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

Restoring, each rank reads only its own box of every sharded tensor
(:mod:`burst.parallel.reshard`); :func:`check` and :func:`sharded_counterparts` say, from
shapes alone, whether the snapshot fits and which saved tensors are cut like which live
DTensor, and :func:`load` hands the DTensors to DCP (``full_state_dict=False``).
:func:`full_state` (gathering everything to rank 0) is the capture side of format 1.
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
    a DTensor's shape is the full one). Saved values need only a ``shape``: tensors, or
    stand-ins checked before a byte is read."""
    if saved_model is None:
        raise SnapshotError("the snapshot holds no model state")
    live = {clean_name(k): tuple(v.shape) for k, v in model.state_dict().items()}
    for name in live.keys() ^ saved_model.keys():
        where = "lacks" if name in live else "has, the model does not,"
        raise SnapshotError(f"the snapshot {where} model tensor {name!r}")
    for name, shape in live.items():
        stored = _shape(saved_model[name])
        if stored != shape:
            raise SnapshotError(f"model tensor {name!r} is {stored} in the snapshot, "
                                f"{shape} in the model")
    if optimizer is not None and saved_optim is not None:
        _check_optimizer(optimizer, saved_optim)


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def _check_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    params = _params(optimizer)
    count = sum(len(g.get("params", [])) for g in saved.get("param_groups", []))
    if len(saved.get("param_groups", [])) != len(optimizer.param_groups) or count != len(params):
        raise SnapshotError(f"the snapshot's optimizer holds {count} parameters, "
                            f"this one {len(params)}")
    for index, values in saved.get("state", {}).items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(
                values, dict):
            raise SnapshotError(f"the snapshot's optimizer has state for parameter {index!r}, "
                                f"this one has {len(params)} parameters")
        for key, value in values.items():
            shape = _shape(value)
            if shape and shape != tuple(params[index].shape):
                raise SnapshotError(f"optimizer state {key!r} of parameter {index} is {shape}, "
                                    f"the parameter {tuple(params[index].shape)}")


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in index order (as ``state_dict()`` numbers them)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def sharded_counterparts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                         saved_model: dict, saved_optim: dict | None) -> list[tuple[Any, DTensor]]:
    """Each saved model or optimizer value (after :func:`check`) that is to be cut like a
    live DTensor, with that DTensor: model tensors whose live tensor is one, and optimizer
    state with the global shape of a DTensor parameter (a step counter is not cut)."""
    live = {clean_name(k): v for k, v in model.state_dict().items()}
    pairs = [(value, live[name]) for name, value in saved_model.items()
             if isinstance(live[name], DTensor)]
    if optimizer is None or saved_optim is None:
        return pairs
    params = _params(optimizer)
    for index, values in saved_optim.get("state", {}).items():
        param = params[index]
        if isinstance(param, DTensor):
            pairs += [(value, param) for value in values.values()
                      if _shape(value) == tuple(param.shape)]
    return pairs


def local_box(live: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (offsets, sizes) of this rank's part of ``live`` in the global tensor."""
    local = tuple(live.to_local().shape)
    if 0 in local:  # an empty shard (more ranks than rows)
        return (0,) * len(local), local
    chunks = live.__create_chunk_list__()
    if len(chunks) != 1 or tuple(chunks[0].sizes) != local:
        raise SnapshotError(f"a DTensor laid out as {live.placements} is not one box per "
                            "rank: burst restores FSDP2 and row/column sharding only")
    return tuple(chunks[0].offsets), local


def like(region: torch.Tensor, live: DTensor) -> DTensor:
    """``region`` (this rank's box of a tensor) as a DTensor placed like ``live``."""
    return DTensor.from_local(region, live.device_mesh, live.placements, shape=live.shape,
                              stride=live.stride(), run_check=False)


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
         saved_model: dict, saved_optim: dict | None) -> None:
    """Put a checked state into the live model and optimizer. A state whose sharded
    tensors are this rank's DTensors (:mod:`burst.parallel.reshard`) is loaded as is;
    one of full tensors is cut into the live shards (each rank keeps its own)."""
    full = not any(isinstance(v, DTensor) for v in saved_model.values())
    if not full:
        _load_shards(model, optimizer, saved_model, saved_optim)
        return
    options = StateDictOptions(full_state_dict=full, strict=True)
    if optimizer is None or saved_optim is None:
        set_model_state_dict(model, saved_model, options=options)
        return
    set_state_dict(model, optimizer, model_state_dict=saved_model,
                   optim_state_dict=by_name(saved_optim, model, optimizer), options=options)


def _load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 saved_model: dict, saved_optim: dict | None) -> None:
    """Load this rank's DTensor shards with the modules' and optimizer's own
    ``load_state_dict``, each DTensor copied into the live one placed alike.

    DCP's ``set_state_dict`` would first run a zero-gradient optimizer step over the whole
    model to create the state it then overwrites (a third of a 4 -> 2 restore's time in
    ``scripts/bench_sharded.py``); a plain optimizer loads state keyed by parameter
    index, which is how a snapshot keys it, without one."""
    names = {clean_name(k): k for k in model.state_dict()}
    model.load_state_dict({names[name]: value for name, value in saved_model.items()},
                          strict=True)
    if optimizer is not None and saved_optim is not None:
        optimizer.load_state_dict(saved_optim)

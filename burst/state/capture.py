"""What a snapshot holds, and putting it back: model, optimizer, scheduler, scaler, RNG,
extra, and what the loop carries (:mod:`burst.state.carry`).

Capture returns the state as a JSON tree plus a table of live tensors (not yet copied:
the RAM shadow copies them). Restore is two-phase: everything is checked against the
live objects first, and only if every check passes is anything changed, so a snapshot
that does not fit leaves the run exactly as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from burst.errors import SnapshotError
from burst.snapshot import tree
from burst.state import amp as amp_rules
from burst.state import rng
from burst.state.carry import LoopState


@dataclass
class Components:
    """The live objects a run snapshots; anything but the model may be absent."""

    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any | None = None  # anything with state_dict()/load_state_dict()
    scaler: Any | None = None  # torch.amp.GradScaler
    loop: LoopState | None = None  # carried values, the batch source's place


@dataclass
class RestoreReport:
    """What a restore did: where it resumed from and anything it had to change."""

    step: int
    epoch: int
    samples_consumed: int
    reason: str
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = (f"resumed at step {self.step} (epoch {self.epoch}, "
                f"{self.samples_consumed} samples consumed) from a snapshot "
                f"taken on {self.reason}")
        return "; ".join([head, *self.notes])


def capture(components: Components, extra: dict, rng_state: dict | None = None,
            model_buffers: dict[str, torch.Tensor] | None = None
            ) -> tuple[dict, dict[str, torch.Tensor]]:
    """The state as (JSON tree, live tensors by name).

    ``rng_state`` and ``model_buffers`` replace the live ones when the live ones have
    moved on since the step boundary being captured (an OOM mid-step).
    """
    tensors: dict[str, torch.Tensor] = {}
    model_state = components.model.state_dict() if components.model is not None else None
    if model_state is not None and model_buffers:
        model_state.update({k: v for k, v in model_buffers.items() if k in model_state})
    state = {
        "model": model_state,
        "optimizer": _state_dict(components.optimizer),
        "scheduler": _state_dict(components.scheduler),
        "scaler": _state_dict(components.scaler),
        "rng": rng.storable(rng_state if rng_state is not None else rng.capture()),
        "extra": extra,
    }
    loop = components.loop.capture() if components.loop is not None else None
    if loop is not None:  # left out when nothing is carried: the tree stays as it was
        state["loop"] = loop
    return tree.encode(state, "state", tensors), tensors


def _state_dict(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


def decode(manifest: dict, tensors: Mapping[str, object]) -> dict[str, Any]:
    """Rebuild the state tree of a manifest with its (verified) tensors (or what stands in
    for them: references, for a skeleton of the state)."""
    try:
        referenced = tree.tensor_names(manifest["state"])
    except RecursionError:
        raise SnapshotError("snapshot state is nested too deeply to be real: refusing it") from None
    missing = [name for name in referenced if name not in tensors]
    if missing:
        raise SnapshotError(f"snapshot state refers to tensor {missing[0]!r}, which it does not hold")
    try:
        return tree.decode(manifest["state"], tensors.__getitem__)
    except RecursionError:
        raise SnapshotError("snapshot state is nested too deeply to be real: refusing it") from None


def restore(components: Components, state: dict, *, saved_amp: str | None,
            amp: str | None) -> list[str]:
    """Check, then apply ``state`` to ``components``; return notes on what changed."""
    _check_model(components.model, state.get("model"))
    _check_optimizer(components.optimizer, state.get("optimizer"))
    rng.check(state.get("rng"))
    if components.loop is not None:
        components.loop.check(state.get("loop"))
    notes: list[str] = []
    if components.model is not None and state.get("model") is not None:
        components.model.load_state_dict(state["model"], strict=True)
    if components.optimizer is not None and state.get("optimizer") is not None:
        components.optimizer.load_state_dict(state["optimizer"])
        _own_kept_state(components.optimizer, state["optimizer"])
    if components.scheduler is not None:
        if state.get("scheduler") is None:
            notes.append("scheduler starts fresh: the snapshot has no scheduler state")
        else:
            components.scheduler.load_state_dict(state["scheduler"])
    notes += amp_rules.restore_scaler(components.scaler, state.get("scaler"), saved_amp, amp)
    notes += rng.restore(state["rng"])
    if components.loop is not None:
        notes += components.loop.restore(state.get("loop"))
    return notes


def _own_kept_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Give host tensors the optimizer kept as restored memory of their own.

    ``load_state_dict`` keeps a state tensor as handed to it when it already has its
    parameter's device and dtype. From a local tier that tensor lies in the snapshot's
    file, mapped copy-on-write: its first update would then fault in each 4 KiB page
    apart, slower than one bulk copy now, and a file that retention deletes would keep
    its disk space while mapped. State it moved to a GPU is a copy already. State read
    into memory from another store is copied once more, as torch does not say which
    tensors are mapped: one bulk copy, against a fault per page for every mapped one."""
    handed = {id(value) for values in saved.get("state", {}).values()
              for value in values.values() if isinstance(value, torch.Tensor)}
    for values in optimizer.state.values():
        for key, value in values.items():
            if id(value) in handed and value.device.type == "cpu" and value.numel():
                values[key] = value.clone()


def _check_model(model: torch.nn.Module | None, saved: dict | None) -> None:
    if model is None or saved is None:
        if model is not None:
            raise SnapshotError("the snapshot holds no model state")
        return
    live = model.state_dict()
    missing = [k for k in live if k not in saved]
    unexpected = [k for k in saved if k not in live]
    if missing:
        raise SnapshotError(f"the snapshot lacks model tensor {missing[0]!r}")
    if unexpected:
        raise SnapshotError(f"the snapshot has model tensor {unexpected[0]!r}, the model does not")
    for name, tensor in live.items():
        stored = saved[name]
        if not isinstance(stored, torch.Tensor) or stored.shape != tensor.shape:
            shape = tuple(stored.shape) if isinstance(stored, torch.Tensor) else type(stored)
            raise SnapshotError(f"model tensor {name!r} is {shape} in the snapshot, "
                                f"{tuple(tensor.shape)} in the model")


def _check_optimizer(optimizer: torch.optim.Optimizer | None, saved: dict | None) -> None:
    if optimizer is None or saved is None:
        return
    groups = saved.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups):
        raise SnapshotError(f"the snapshot's optimizer has {len(groups)} parameter groups, "
                            f"this one {len(optimizer.param_groups)}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved_ids = [i for g in groups for i in g.get("params", [])]
    if len(saved_ids) != len(params):
        raise SnapshotError(f"the snapshot's optimizer holds {len(saved_ids)} parameters, "
                            f"this one {len(params)}")
    for index, param in zip(saved_ids, params, strict=True):
        for key, value in saved.get("state", {}).get(index, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                raise SnapshotError(f"optimizer state {key!r} of parameter {index} is "
                                    f"{tuple(value.shape)}, the parameter {tuple(param.shape)}")

"""Activation checkpointing by module type: trade compute for activation memory.

``wrap(model, ["Block"])`` makes every submodule whose class is named ``Block`` run its
forward under ``torch.utils.checkpoint``: its activations are dropped after the forward and
recomputed in the backward. The arithmetic is the same (the RNG state is replayed), so the
gradients match; the parameters and their names do not change, so snapshots are unaffected.
A memory rule (``"memory > 90%: activation_checkpointing=Block"``) applies it mid-run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from burst.errors import ConfigError

_MARK = "_burst_checkpointed"  # set on a wrapped module, so wrapping twice is a no-op


def wrap(model: torch.nn.Module | None, type_names: Sequence[str]) -> list[str]:
    """Checkpoint the forward of ``model``'s submodules of the named types; return the
    names of the submodules newly wrapped. Unknown type names are an error."""
    if model is None:
        raise ConfigError("activation checkpointing needs run.attach(model) first")
    wanted = set(type_names)
    present = {type(m).__name__ for m in model.modules()}
    missing = sorted(wanted - present)
    if missing:
        raise ConfigError(f"activation checkpointing: no module of type {', '.join(missing)} "
                          f"in the model")
    wrapped = []
    for name, module in model.named_modules():
        if type(module).__name__ in wanted and not getattr(module, _MARK, False):
            _checkpoint_forward(module)
            wrapped.append(name)
    return wrapped


def _checkpoint_forward(module: torch.nn.Module) -> None:
    forward = module.forward  # the bound method; the instance attribute shadows it

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed
    setattr(module, _MARK, True)

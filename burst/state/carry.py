"""What a hand-written loop carries from one step to the next, besides model and optimizer.

An LSTM's hidden state, an EMA of the weights kept outside the model, a curriculum level:
values the next step starts from, so a resumed run that lacks them is not the same run.
The user hands burst a dict of them (``Run.attach(..., carry={...})``) and keeps it
current; every snapshot holds its contents as they are at the step boundary (tensors on
any device, numbers, strings, and lists, tuples and dicts of them: what
:mod:`burst.snapshot.tree` encodes, never a pickle).

Restoring puts the saved values back *into* that dict: a tensor the dict already holds
with the saved shape and dtype is overwritten in place (an EMA's tensors, shared with
whatever else refers to them, come back without a re-read), any other value is replaced,
a tensor moved to the device of the one it replaces. A key the snapshot lacks keeps the
value given (and the restore report says so).

The batch source of ``Run.batches`` (:mod:`burst.training.batches`) keeps its place here
too: the epoch and the position it had reached at the boundary, and its own random
stream's state (:mod:`burst.state.streams`) as it was before the first batch not yet
consumed, so batches drawn ahead of a step boundary are drawn again, the same, on resume.
"""

from __future__ import annotations

from typing import Any

import torch

from burst.errors import ConfigError, SnapshotError
from burst.snapshot import tree
from burst.state import rng

CARRY, BATCHES = "carry", "batches"


class LoopState:
    """The loop's carried values and its batch source's place, captured at each boundary."""

    def __init__(self) -> None:
        self.carry: dict[str, Any] | None = None
        # {"epoch", "position", "stream"} at the last step boundary (set by Run.batches)
        self.batches: dict[str, Any] | None = None

    def hold(self, carry: dict[str, Any]) -> None:
        """Take ``carry`` as the dict to snapshot, refusing what a snapshot cannot hold."""
        if not isinstance(carry, dict) or not all(isinstance(k, str) for k in carry):
            raise ConfigError("carry= takes a dict with string keys, e.g. "
                              "carry={'hidden': hidden}")
        try:
            tree.encode(carry, CARRY, {})
        except SnapshotError as exc:
            raise ConfigError(f"carry: {exc}") from None
        self.carry = carry

    def capture(self) -> dict[str, Any] | None:
        """The state to snapshot now, or None when the loop carries nothing."""
        out: dict[str, Any] = {}
        if self.carry is not None:
            out[CARRY] = dict(self.carry)
        if self.batches is not None:
            out[BATCHES] = {**self.batches, "stream": rng.storable(self.batches["stream"])}
        return out or None

    def check(self, saved: Any) -> None:
        """Raise ``SnapshotError`` unless ``saved`` is what :meth:`capture` makes."""
        if saved is None:
            return
        if not isinstance(saved, dict) or not isinstance(saved.get(CARRY, {}), dict):
            raise SnapshotError("the snapshot's loop state is malformed")
        batches = saved.get(BATCHES)
        if batches is not None:
            if not (isinstance(batches, dict) and isinstance(batches.get("epoch"), int)
                    and isinstance(batches.get("position"), int)):
                raise SnapshotError("the snapshot's batch source state is malformed")
            rng.check(batches.get("stream"))

    def restore(self, saved: dict[str, Any] | None) -> list[str]:
        """Apply a checked ``saved`` (see the module docstring); return notes."""
        saved = saved or {}
        if saved.get(BATCHES) is not None:
            self.batches = dict(saved[BATCHES])
        if self.carry is None:
            return []
        stored = saved.get(CARRY) or {}
        for key, value in stored.items():
            self.carry[key] = _restored(self.carry.get(key), value)
        missing = sorted(k for k in self.carry if k not in stored)
        if missing:
            return [f"carry {', '.join(missing)} not in the snapshot: starts from the value "
                    "given to attach"]
        return []


def _restored(given: Any, saved: Any) -> Any:
    """``saved`` put where ``given`` was: into it when it is a tensor of the same layout
    (or a container of such), else in its place (a tensor on ``given``'s device)."""
    if isinstance(saved, torch.Tensor) and isinstance(given, torch.Tensor):
        if given.shape == saved.shape and given.dtype == saved.dtype:
            with torch.no_grad():
                given.copy_(saved)
            return given
        return saved.to(given.device, copy=True)
    if isinstance(saved, dict) and isinstance(given, dict):
        for key, value in saved.items():
            given[key] = _restored(given.get(key), value)
        return given
    if isinstance(saved, list) and isinstance(given, list) and len(saved) == len(given):
        given[:] = [_restored(g, s) for g, s in zip(given, saved, strict=True)]
        return given
    if isinstance(saved, tuple) and isinstance(given, tuple) and len(saved) == len(given):
        return tuple(_restored(g, s) for g, s in zip(given, saved, strict=True))
    return _owned(saved)


def _owned(saved: Any) -> Any:
    """``saved`` with every tensor in memory of its own, not a view of a snapshot's file."""
    if isinstance(saved, torch.Tensor):
        return saved.clone()
    if isinstance(saved, dict):
        return {key: _owned(value) for key, value in saved.items()}
    if isinstance(saved, list | tuple):
        return type(saved)(_owned(value) for value in saved)
    return saved

"""The boundary copies: what a partial step will disturb, kept as it was at the step's start.

An OOM mid-step must still yield the exact state of the last step boundary, and the
forward pass moves two things a snapshot holds before ``optimizer.step()`` changes
anything else: the random generators and the model's buffers (BatchNorm statistics).
``BoundaryCopies.mark`` copies both at each boundary; ``Rescue.save_boundary`` captures the
live state with these in their place.

Every step pays for this, so it only copies: the generators' states as their libraries
hand them out, the buffers into copies allocated once (on their own device, so a GPU copy
is queued, never waited for). The buffers are looked up again only when one was assigned
anew (a registration hook says so) or at a shadow copy (``Module.to`` replaces them
without telling anyone).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.module import register_module_buffer_registration_hook

from burst.state import rng


class BoundaryCopies:
    """The RNG states and persistent buffers of the last step boundary, for one model."""

    def __init__(self) -> None:
        self.rng_state: dict | None = None  # None: no boundary marked (nothing to rewind to)
        self.buffers: dict[str, torch.Tensor] = {}  # preallocated copies
        self._rng = rng.Boundary()  # cheap per-step captures of the generators
        self._live: list[tuple[str, torch.Tensor]] = []  # what the copies copy
        self._moved = True  # a buffer was (re)assigned: find them again
        self._hook: Any = None
        self._names: frozenset[str] = frozenset()  # persistent buffers only

    def track(self, model: torch.nn.Module) -> bool:
        """Copy ``model``'s persistent buffers from now on; True when this installed the
        process-wide registration hook (the caller undoes it with :meth:`unhook`)."""
        self._names = frozenset(model.state_dict().keys())
        self._moved = True
        if self._hook is not None:
            return False
        self._hook = register_module_buffer_registration_hook(self._assigned)
        return True

    def unhook(self) -> None:
        """Remove the registration hook (at close, or when attach is refused)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def mark(self, model: torch.nn.Module | None, needed: bool) -> None:
        """Copy the boundary state, when a rewind can be ``needed``: only a CUDA
        out-of-memory error or GPU failure rewinds, and a process that has not initialised
        CUDA can raise neither (but in a drill). It then marks nothing (a quarter of
        burst's per-step cost on a small CPU model), and ``Rescue.save_boundary`` falls back
        on the RAM shadow should CUDA start mid-step."""
        if not needed:
            self.rng_state = None
            return
        self.rng_state = self._rng.capture()
        if self._moved:
            self._find(model)
        for name, live in self._live:
            self.buffers[name].copy_(live.detach())

    def check(self, model: torch.nn.Module | None) -> None:
        """At a shadow copy: notice buffers replaced behind the hook's back."""
        if model is None or self._moved:
            return
        current = self._persistent(model)
        if len(current) != len(self._live) or any(
                n != m or b is not c for (n, b), (m, c) in zip(current, self._live,
                                                               strict=True)):
            self._moved = True

    def _find(self, model: torch.nn.Module | None) -> None:
        """(Re)build the list of persistent buffers and their preallocated copies."""
        self._moved = False
        live = [] if model is None else self._persistent(model)
        copies = self.buffers
        self.buffers = {
            name: copies[name] if _same_layout(copies.get(name), b)
            else torch.empty_like(b, memory_format=torch.preserve_format)
            for name, b in live}
        self._live = live

    def _persistent(self, model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        return [(n, b) for n, b in model.named_buffers() if n in self._names]

    def _assigned(self, *_: object) -> None:
        self._moved = True


def _same_layout(copy: torch.Tensor | None, live: torch.Tensor) -> bool:
    return (copy is not None and copy.shape == live.shape and copy.dtype == live.dtype
            and copy.device == live.device)

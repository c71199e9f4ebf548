"""What a run trains, and what each of its snapshots keeps of it.

The live objects registered by ``Run.attach`` (model, optimizer, scheduler, scaler, the
loop's carried values), the user's ``extra`` state, the experiment trackers, the loader's
sampler, and the batch layout and precision in force. One record, so the parts that
capture, describe and restore a run (``burst.training.rescue``, the restorer, the memory
re-plan) all read the same objects, and ``run.model``-like attributes read it through
(``burst.training.forward``): the run replaces a field (a re-planned layout, a resumed
``extra``), never copies it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from burst.errors import ConfigError
from burst.parallel import state as dist_state
from burst.parallel.group import unwrap
from burst.state.capture import Components
from burst.state.carry import LoopState
from burst.training import precision
from burst.training.layout import Layout
from burst.training.sampler import ResumableSampler
from burst.training.trackers import STATE_KEY as TRACKERS_KEY
from burst.training.trackers import Trackers


@dataclass
class Subject:
    """The objects one run trains, with its layout and precision."""

    plan: Layout  # the batch layout in force: re-planned whole, never edited
    amp: str | None  # the precision in force (a memory rule may change it)
    components: Components = field(default_factory=lambda: Components(loop=LoopState()))
    extra: dict[str, Any] = field(default_factory=dict)  # the user's, kept in snapshots
    trackers: Trackers = field(default_factory=Trackers)  # curves that continue on resume
    sampler: ResumableSampler | None = None  # the loader's, once adopted
    saved_sampler: dict | None = None  # a restored snapshot's, until a sampler is adopted

    def hold(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             scheduler: Any, scaler: Any, carry: dict[str, Any] | None) -> None:
        """Register what to snapshot (``attach``); ``carry`` is one process's values."""
        loop = self.components.loop or LoopState()
        if carry is not None:
            if self.plan.world_size > 1:
                raise ConfigError("carry= holds one process's values; on several ranks "
                                  "each rank's would need saving, which burst does not yet")
            loop.hold(carry)
        self.components = Components(unwrap(model), optimizer, scheduler, scaler, loop=loop)

    def adopt(self, sampler: object) -> ResumableSampler:
        """Make ``sampler`` the run's, checked against the restored snapshot's data."""
        self.sampler = self.plan.adopt(sampler, self.saved_sampler)
        self.saved_sampler = None
        return self.sampler

    def restored(self, saved: dict[str, Any], manifest: dict) -> None:
        """Take a snapshot's non-tensor state: ``extra``, the trackers', the sampler's."""
        self.extra = saved.get("extra") or {}
        self.trackers.restore(self.extra.pop(TRACKERS_KEY, None))
        self.saved_sampler = manifest.get("sampler")

    def extra_state(self) -> dict[str, Any]:
        """``extra`` as a snapshot keeps it: with the trackers' state when there are any."""
        if not self.trackers:
            return self.extra
        return {**self.extra, TRACKERS_KEY: self.trackers.state()}

    def sampler_state(self) -> dict | None:
        """Where the data stands: the sampler's, or the restored one's until adopted."""
        return self.sampler.state() if self.sampler else self.saved_sampler

    def precision(self) -> str | None:
        """The precision a snapshot records (``burst.training.precision.in_force``)."""
        return precision.in_force(self.amp, self.components.scaler)

    def layout(self) -> dict[str, Any]:
        """The batch layout: global and micro batch, accumulation, world size, and whether
        the model is sharded (FSDP2: the planner then counts its state per rank)."""
        layout = self.plan.as_dict()
        if dist_state.sharded(self.components):
            layout["sharded"] = True
        return layout

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler that is enabled exactly when the run's precision needs one (fp16)."""
        return precision.grad_scaler(self.amp, self.components.model)

    def autocast(self, device_type: str | None = None) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the run's precision (a no-op in full precision)."""
        return precision.autocast(self.amp, self.components.model, device_type)

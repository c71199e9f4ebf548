"""Several ranks: the process group, a step's partition across ranks, sharded state.

A training script on several ranks uses three names from here::

    import burst.parallel
    burst.parallel.init_from_env()              # torchrun's or SkyPilot's variables
    for x, y in burst.parallel.accumulate(step, model): ...
    burst.parallel.torchrun_shell("train.py")   # a SkyPilot task's ``run:`` line

They load on first use (PEP 562), so the pure modules here (``partition``) import
without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from burst.parallel.group import accumulate, init_from_env
    from burst.parallel.launching import torchrun_command, torchrun_shell


_HOMES = {"accumulate": "burst.parallel.group", "init_from_env": "burst.parallel.group",
          "torchrun_command": "burst.parallel.launching",
          "torchrun_shell": "burst.parallel.launching"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'burst.parallel' has no attribute {name!r}")


__all__ = ["accumulate", "init_from_env", "torchrun_command", "torchrun_shell"]

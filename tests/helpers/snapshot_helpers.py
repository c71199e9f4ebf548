"""The one way tests make a snapshot: a real commit through the persister's own path."""

from __future__ import annotations

from typing import Any

import torch

from burst.snapshot.tiers import Captured, write_snapshot
from burst.store.base import Store


def take(store: Store, step: int, tensors: dict[str, torch.Tensor] | None = None, *,
         run_id: str = "run", **meta: Any) -> dict:
    """Commit a snapshot of ``tensors`` at ``step`` into ``store``; return its manifest.

    By default the state is one small tensor holding ``step`` (each snapshot differs);
    ``meta`` adds manifest fields (``counters``, ``time``, ``batch``...) to a periodic one.
    """
    if tensors is None:
        tensors = {"w": torch.full((1000,), float(step))}
    tree = {name: {"$tensor": name} for name in tensors}
    return write_snapshot(store, run_id, Captured(step, tree, tensors,
                                                  {"reason": "periodic", **meta}))

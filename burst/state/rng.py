"""Capture and restore every random number generator a training step can draw from.

Python's ``random``, NumPy's global generator, torch's CPU generator and, when CUDA is
already in use, each CUDA device's generator. CUDA is never initialised just to read its
state: a process that has not touched the GPU has no CUDA randomness to preserve.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from burst.errors import SnapshotError


def capture() -> dict[str, Any]:
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> list[str]:
    """Apply ``state``; return notes on anything that could not be restored exactly."""
    notes: list[str] = []
    random.setstate(_python_state(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"].clone())
    notes.extend(_restore_cuda(state.get("cuda")))
    return notes


def check(state: Any) -> None:
    """Raise ``SnapshotError`` unless ``state`` is what :func:`capture` makes.

    Tried on throwaway generators, so a restore can refuse a malformed snapshot before it
    has changed anything (the model and optimizer are loaded before the RNGs).
    """
    try:
        random.Random().setstate(_python_state(state["python"]))
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.RandomState().set_state((kind, np.asarray(keys, dtype=np.uint32), pos,
                                           has_gauss, gauss))
        torch.Generator().set_state(state["torch"].clone())  # a view into a blob: copy
        cuda = state.get("cuda") or []
        if not isinstance(cuda, list) or not all(isinstance(s, torch.Tensor) for s in cuda):
            raise TypeError("cuda states are not tensors")
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise SnapshotError(f"the snapshot's RNG state is malformed ({exc})") from None


def _python_state(value: Any) -> tuple:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def _restore_cuda(saved: list[torch.Tensor] | None) -> list[str]:
    if not saved:
        return []
    if not torch.cuda.is_available():
        return [f"CUDA RNG state of {len(saved)} device(s) not restored: no CUDA here"]
    count = torch.cuda.device_count()
    if count == len(saved):
        torch.cuda.set_rng_state_all([s.clone() for s in saved])
        return []
    for device in range(min(count, len(saved))):
        torch.cuda.set_rng_state(saved[device].clone(), device)
    return [f"CUDA RNG restored for {min(count, len(saved))} of {len(saved)} saved device(s) "
            f"({count} present)"]

"""Random generators per rank: recorded for every rank, restored or re-created per rank.

Each rank draws from its own generators (Python, NumPy, torch CPU, its CUDA device), so a
snapshot of a run on N ranks records N generator states: every rank sends its state to
rank 0 as JSON, and rank 0 stores them in the snapshot as ``rng_ranks`` (rank 0's also
stays under ``rng``, where a single-process snapshot keeps its only one).

On restore, rank ``r`` takes the state rank ``r`` saved. A rank the snapshot has no state
for (the run grew from fewer ranks) gets generators seeded from ``(run seed, snapshot
step, r)``: the same streams every time that snapshot is restored at that rank, and
independent of every other rank's. A rank whose state is not restored at all (the run
shrank) loses its stream; it cannot be folded into another rank's.

What is exact across a world-size change, and what cannot be, is summed up in the
README ("Scaling out").
"""

from __future__ import annotations

from typing import Any

import torch

from burst.state import rng
from burst.state.rng import derive_seed


def to_json(state: dict[str, Any]) -> dict[str, Any]:
    """An :func:`burst.rng.capture` state as plain JSON (to cross to rank 0)."""
    state = rng.as_lists(state)
    version, internal, gauss = state["python"]
    out: dict[str, Any] = {"python": [version, list(internal), gauss], "numpy": state["numpy"],
                           "torch": _hex(state["torch"])}
    if "cuda" in state:
        out["cuda"] = [_hex(t) for t in state["cuda"]]
    return out


def from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`to_json`: generator states as tensors again."""
    version, internal, gauss = data["python"]
    state: dict[str, Any] = {"python": (version, tuple(internal), gauss),
                             "numpy": list(data["numpy"]), "torch": _unhex(data["torch"])}
    if "cuda" in data:
        state["cuda"] = [_unhex(h) for h in data["cuda"]]
    return state


def _hex(tensor: torch.Tensor) -> str:
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes().hex()


def _unhex(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(text)), dtype=torch.uint8)


def rank_seed(seed: int, step: int, rank: int) -> int:
    """The seed of a re-created rank's generators (a pure function of the three)."""
    return derive_seed("rank-rng", seed, step, rank, bits=63)


def derived(seed: int, step: int, rank: int) -> dict[str, Any]:
    """Fresh generator states for ``rank``, built without touching the live generators.

    CUDA is left out: :func:`seed_cuda` seeds the rank's device once it is restored.
    """
    state = rng.seeded(rank_seed(seed, step, rank))
    state["numpy"][1] = state["numpy"][1].tolist()  # as a rank's state crosses to rank 0
    return state


def for_rank(saved: dict[str, Any], rank: int, seed: int, step: int
             ) -> tuple[dict[str, Any], int | None]:
    """The generator state ``rank`` resumes with, and the seed if it had to be re-created."""
    states = saved.get("rng_ranks") or [saved["rng"]]
    if rank < len(states):
        return states[rank], None
    return derived(seed, step, rank), rank_seed(seed, step, rank)


def seed_cuda(value: int) -> None:
    """Seed this process's CUDA generators, if it uses CUDA at all."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)

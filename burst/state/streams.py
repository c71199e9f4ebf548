"""Random generators of their own for code that draws from the global ones.

A batch source such as nanoGPT's ``get_batch`` calls ``torch.randint`` on torch's global
generator, the one dropout draws from too. Called through :meth:`Stream.drawing`, it
draws from the stream's own states instead: the global generators are set aside, the
stream's put in their place, and after the call the stream keeps what they became and the
global ones come back untouched. So the batches a run draws never shift the model's
randomness, and drawing a batch ahead of time (prefetch) moves nothing a step-boundary
snapshot holds. The swap costs two captures (keys that did not move are not read again)
and two restores, about 0.1 ms, once per micro-batch.

CUDA generators are swapped too once CUDA is in use: a stream that has none yet seeds
each device's from its own seed the first time it draws there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from burst.state import rng


class Stream:
    """Python, NumPy, torch CPU (and CUDA) generator states that code draws from only
    inside :meth:`drawing`."""

    def __init__(self, seed: int, state: dict[str, Any] | None = None) -> None:
        self.seed = seed
        # replaced after every draw, never changed in place: a reference to it is a copy
        self.state: dict[str, Any] = state if state is not None else rng.seeded(seed)
        # captures that skip re-reading a Mersenne Twister key that did not move: one for
        # the global generators between draws, one for this stream's after them
        self._outside, self._inside = rng.Boundary(), rng.Boundary()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Run the block with this stream in place of the global generators."""
        outside = self._outside.capture()
        rng.restore(self.state)
        if "cuda" not in self.state and "cuda" in outside:
            torch.cuda.manual_seed_all(self.seed)  # the stream's first draw on the card
        try:
            yield
        finally:
            self.state = self._inside.capture()
            rng.restore(outside)

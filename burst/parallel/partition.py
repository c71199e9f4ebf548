"""Splitting each optimizer step's global batch across ranks (pure arithmetic, no torch).

One global sample order per epoch is cut into optimizer steps of ``global_batch`` samples
(the last step of an epoch may be shorter). Each step is then split into ``world_size``
contiguous chunks, in rank order, as evenly as possible::

    step's samples:  [ s0 s1 s2 s3 | s4 s5 s6 s7 ]      global batch 8, 2 ranks
                       rank 0        rank 1

So concatenating the ranks' chunks gives back exactly the single-rank order: every
optimizer step consumes the same *set* of samples (in the same order) whatever the world
size, and the only position a run needs is the number of global samples consumed. Steps
start at multiples of ``global_batch`` from the epoch start, so a restart at any step
boundary partitions the rest of the epoch exactly as an uninterrupted run would.

Ranks must run the same number of micro-batches per step: under DDP or FSDP every
micro-batch is a collective. A full step always satisfies this (``micro * world`` divides
the global batch); :func:`check_lockstep` rejects the rare epoch tail that cannot.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from burst.errors import ConfigError


def shares(samples: int, world_size: int) -> list[int]:
    """Per-rank sample counts of one step: contiguous, the first ranks take the remainder."""
    base, extra = divmod(samples, world_size)
    return [base + (rank < extra) for rank in range(world_size)]


def step_sizes(remaining: int, global_batch: int) -> Iterator[int]:
    """Global samples of each optimizer step over the ``remaining`` samples of an epoch."""
    while remaining > 0:
        samples = min(global_batch, remaining)
        remaining -= samples
        yield samples


def rank_steps(remaining: int, global_batch: int, rank: int, world_size: int
               ) -> Iterator[tuple[int, int]]:
    """``(global samples, this rank's samples)`` of each remaining step."""
    full = shares(global_batch, world_size)[rank]  # every step but an epoch's tail: once
    for samples in step_sizes(remaining, global_batch):
        yield samples, full if samples == global_batch else shares(samples, world_size)[rank]


def rank_positions(remaining: int, global_batch: int, rank: int, world_size: int
                   ) -> np.ndarray:
    """Offsets, into the rest of the epoch's order, of the samples ``rank`` consumes."""
    full, tail = divmod(remaining, global_batch)
    lo, hi = _bounds(global_batch, rank, world_size)
    body = np.arange(full * global_batch).reshape(full, global_batch)[:, lo:hi].reshape(-1)
    tail_lo, tail_hi = _bounds(tail, rank, world_size)
    return np.concatenate([body, np.arange(tail_lo, tail_hi) + full * global_batch])


def _bounds(samples: int, rank: int, world_size: int) -> tuple[int, int]:
    split = shares(samples, world_size)
    first = sum(split[:rank])
    return first, first + split[rank]


def rank_count(remaining: int, global_batch: int, rank: int, world_size: int) -> int:
    """How many of the ``remaining`` samples ``rank`` consumes (without listing them)."""
    full, tail = divmod(remaining, global_batch)
    return full * shares(global_batch, world_size)[rank] + shares(tail, world_size)[rank]


def check_lockstep(remaining: int, global_batch: int, micro_batch: int, world_size: int) -> None:
    """Refuse a split in which ranks would run different numbers of micro-batches.

    Only the epoch's last, short step can do that: when it has fewer leftover samples
    than ranks in its last round of micro-batches. Under DDP or FSDP a rank with fewer
    micro-batches would leave the others waiting in a collective forever.
    """
    if world_size == 1:
        return
    tail = remaining % global_batch
    counts = {math.ceil(share / micro_batch) for share in shares(tail, world_size)} if tail else set()
    if len(counts) > 1 or 0 in counts:
        raise ConfigError(
            f"the epoch's last step has {tail} samples, which {world_size} ranks at micro-batch "
            f"{micro_batch} cannot split into equal numbers of micro-batches; use "
            "ResumableSampler(drop_last=True), or a micro-batch or world size that splits it"
        )

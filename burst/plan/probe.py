"""Find the largest micro-batch that runs on this card by trying, largest first.

The planner predicts a micro-batch from memory the run recorded elsewhere; on the new node
this confirms it (or, with nothing recorded, finds it), in the manner of Accelerate's
``find_executable_batch_size``: call a step at one size, and on an out-of-memory error
free what the failed attempt held and try the next smaller size. Only sizes that split the
global batch exactly are tried (the plan lists them), so whatever is found keeps the run
the same run.

The step function should run one forward and backward pass at the given micro-batch size
and must not step the optimizer: a probe must not change the training state.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from burst.contract import ENV_PROBE_MICRO_BATCHES, parse_sizes
from burst.errors import BurstError, ConfigError

_OOM_MESSAGES = ("out of memory", "cudnn_status_not_supported",
                 "cublas_status_alloc_failed", "can't allocate memory")


@dataclass(frozen=True)
class ProbeResult:
    micro_batch: int
    peak_bytes: int | None  # max_memory_allocated during the successful try (CUDA only)
    failed: tuple[int, ...]  # sizes that ran out of memory, in the order tried


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` means the card (or host) ran out of memory for this size."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        text in str(error).lower() for text in _OOM_MESSAGES)


def find_micro_batch(step: Callable[[int], object], sizes: Sequence[int]) -> ProbeResult:
    """The first of ``sizes`` (largest first) at which ``step`` runs without OOM."""
    if not sizes:
        raise ConfigError("nothing to probe: the plan lists no micro-batch sizes")
    failed: list[int] = []
    for size in sizes:
        _reset_peak()
        if _try(step, size):
            return ProbeResult(size, _peak(), tuple(failed))
        failed.append(size)
        _free()  # outside the except block: the failed attempt's frames are gone by now
    raise BurstError(f"out of memory even at micro-batch {sizes[-1]} (tried "
                     f"{', '.join(map(str, failed))}): turn on activation checkpointing or "
                     "use a card with more memory")


def _try(step: Callable[[int], object], size: int) -> bool:
    try:
        step(size)
    except Exception as error:
        if not is_oom(error):
            raise
        return False
    return True


def sizes_from_env(environ: Mapping[str, str] | None = None) -> list[int]:
    """The sizes a plan asked the node to probe (``BURST_PROBE_MICRO_BATCHES``)."""
    raw = (os.environ if environ is None else environ).get(ENV_PROBE_MICRO_BATCHES, "")
    try:
        return list(parse_sizes(raw))
    except ValueError as error:  # the contract's one-line message, as a user's error
        raise ConfigError(str(error)) from None


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _reset_peak() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _peak() -> int | None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated()
    return None

"""The child's side of a GPU memory quota (``burst run --gpu-memory-quota``).

The agent gives the quota in bytes as ``$BURST_GPU_MEMORY_QUOTA``; the run caps PyTorch's
caching allocator to that share of its card, so going past the quota is an ordinary CUDA
OOM (which burst already handles) instead of memory taken from the other runs on the
machine. Without CUDA there is nothing to cap: the quota is only recorded.
"""

from __future__ import annotations

import os

import torch

from burst.contract import ENV_GPU_MEMORY_QUOTA
from burst.errors import ConfigError


def apply(raw: str | None = None) -> dict | None:
    """Cap this process's CUDA allocator to the quota in ``raw`` (default: the env);
    what was done, for the run's history, or None when no quota is set."""
    raw = os.environ.get(ENV_GPU_MEMORY_QUOTA) if raw is None else raw
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 0:
        raise ConfigError(f"${ENV_GPU_MEMORY_QUOTA} must be a positive number of bytes, got {raw!r}")
    quota = int(raw)
    if not torch.cuda.is_available():
        return {"quota": quota, "applied": False}
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, quota / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"quota": quota, "applied": True, "fraction": round(fraction, 6), "total": total}

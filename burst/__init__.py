"""burst: keep a PyTorch training run alive when the GPU under it fails.

The public API is small: a :class:`Run` wraps a plain training loop, a
:class:`ResumableSampler` gives it an exact data position, and
:class:`SeededDataset` makes per-sample randomness replay after a resume.

The names below are loaded on first use (PEP 562), so ``import burst`` and every
command that only looks at a store (``burst ls``, ``burst status``...) never import
torch: that keeps the CLI quick to start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "BurstError": "burst.errors",
    "SnapshotError": "burst.errors",
    "Run": "burst.training.run",
    "Step": "burst.training.run",
    "ResumableSampler": "burst.training.sampler",
    "SampleIndex": "burst.training.sampler",
    "SeededDataset": "burst.training.sampler",
    "input_path": "burst.inputs.place",
}

if TYPE_CHECKING:
    from burst.errors import BurstError, SnapshotError
    from burst.inputs.place import input_path
    from burst.training.run import Run, Step
    from burst.training.sampler import ResumableSampler, SampleIndex, SeededDataset


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this hook
        return value
    raise AttributeError(f"module 'burst' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "BurstError",
    "ResumableSampler",
    "Run",
    "SampleIndex",
    "SeededDataset",
    "SnapshotError",
    "Step",
    "__version__",
    "input_path",
]

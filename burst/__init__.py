"""burst: keep a PyTorch training run alive when the GPU under it fails.

The public API is small: a :class:`Run` wraps a plain training loop, a
:class:`ResumableSampler` gives it an exact data position, and
:class:`SeededDataset` makes per-sample randomness replay after a resume.
"""

__version__ = "0.1.0"

from burst.errors import BurstError, SnapshotError
from burst.run import Run, Step
from burst.sampler import ResumableSampler, SampleIndex, SeededDataset

__all__ = [
    "BurstError",
    "ResumableSampler",
    "Run",
    "SampleIndex",
    "SeededDataset",
    "SnapshotError",
    "Step",
    "__version__",
]

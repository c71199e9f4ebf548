"""Per-GPU memory of a training run as a function of its micro-batch size.

The model is the usual decomposition M = M_param + M_grad + M_opt + M_act. The first three
are *static* and exact: the snapshot holds every parameter and optimizer-state tensor with
its dtype and size. Activations grow with the micro-batch, so that part is a line fitted to
the peaks the library recorded (``torch.cuda.max_memory_allocated`` per micro-batch size):

- two or more sizes: least squares gives the slope (bytes per sample); the intercept is
  then raised until the line covers every recorded peak, so a noisy fit never predicts
  less than was actually seen;
- one size: the intercept is the static part and the slope is what the peak adds to it;
- none (a CPU run, or no step finished on a GPU): the slope is unknown and the plan probes
  on the new card instead of predicting.

Changing the layout changes the static part in known ways: DDP adds gradient buckets as
large as the gradients, and autocast from an fp32 run keeps 16-bit copies of the weights.
Going from 16-bit to fp32 doubles the activations; going the other way is assumed to save
nothing, so predictions err on the side of fitting less.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from burst.errors import SnapshotError
from burst.snapshot.format import entry_nbytes

MODEL_PREFIX = "state/model/"
OPTIMIZER_PREFIX = "state/optimizer/state/"
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                          "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


@dataclass(frozen=True)
class Static:
    """Bytes that do not depend on the micro-batch: weights, gradients, optimizer state."""

    params: int
    grads: int
    optimizer: int
    float32_params: int = 0  # the weights autocast would cast to 16 bits

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def static_bytes(tensors: Mapping[str, Mapping[str, Any]]) -> Static:
    """The static part from a manifest's tensor index (name -> dtype, bytes of the whole
    logical tensor, sharded or not: the plan is per model, then divided per rank).

    Gradients are as large as the parameters the optimizer updates; the optimizer state
    names those (one entry per parameter index, its largest tensor param-shaped). Without
    optimizer state (plain SGD, or no step taken yet) every floating-point model tensor
    but the batch-norm statistics is assumed trainable.
    """
    params = float32 = optimizer = 0
    trainable_guess = 0
    per_param: dict[str, int] = {}
    for name, entry in tensors.items():
        nbytes, dtype = entry_nbytes(entry), str(entry["dtype"])
        if name.startswith(MODEL_PREFIX):
            params += nbytes
            float32 += nbytes if dtype == "float32" else 0
            if dtype in FLOAT_DTYPES and not name.endswith(BUFFER_SUFFIXES):
                trainable_guess += nbytes
        elif name.startswith(OPTIMIZER_PREFIX):
            optimizer += nbytes
            index = name[len(OPTIMIZER_PREFIX):].split("/", 1)[0]
            if dtype in FLOAT_DTYPES:
                per_param[index] = max(per_param.get(index, 0), nbytes)
    grads = sum(per_param.values()) if per_param else trainable_guess
    return Static(params, min(grads, params) if params else grads, optimizer, float32)


@dataclass(frozen=True)
class MemoryModel:
    """Predicted peak bytes per GPU: ``intercept + slope * micro_batch`` plus layout terms."""

    static: Static
    intercept: float
    slope: float | None  # bytes per sample of a micro-batch; None: unknown, probe
    points: tuple[tuple[int, int], ...] = ()  # (micro-batch, recorded peak bytes)
    amp: str | None = None  # precision the peaks were recorded in
    world_size: int = 1  # world size they were recorded at
    sharded: bool = False  # FSDP: weights, gradients and optimizer state split over ranks

    @property
    def needs_probe(self) -> bool:
        return self.slope is None

    def fixed(self, amp: str | None, world_size: int) -> int:
        """The bytes a run in ``amp`` over ``world_size`` GPUs needs at micro-batch 0.

        A sharded model (FSDP) holds ``1/world_size`` of its weights, gradients and
        optimizer state per GPU: the recorded intercept held ``1/self.world_size`` of
        them, so moving to another world size moves that share, and no rank has DDP's
        full gradient buckets."""
        extra = 0.0
        if self.sharded:
            extra += self.static.total * (1 / world_size - 1 / self.world_size)
        elif world_size > 1 and self.world_size == 1:
            extra += self.static.grads  # DDP's gradient buckets
        if amp is not None and self.amp is None:
            share = world_size if self.sharded else 1
            extra += self.static.float32_params // 2 / share  # autocast's 16-bit copies
        return math.ceil(self.intercept + extra)

    def per_sample(self, amp: str | None) -> float | None:
        if self.slope is None:
            return None
        return self.slope * (2 if amp is None and self.amp is not None else 1)

    def predict(self, micro_batch: int, amp: str | None = None, world_size: int = 1) -> int | None:
        """Peak bytes per GPU at ``micro_batch``; None when activations were never measured."""
        slope = self.per_sample(amp)
        if slope is None:
            return None
        return self.fixed(amp, world_size) + math.ceil(slope * micro_batch)

    def largest_fitting(self, budget: int, amp: str | None, world_size: int) -> float:
        """The (fractional) micro-batch whose prediction reaches ``budget``; inf if no limit."""
        slope = self.per_sample(amp)
        room = budget - self.fixed(amp, world_size)
        if slope is None or slope <= 0:
            return math.inf if room >= 0 else -math.inf
        return room / slope


def fit_line(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of peak bytes against micro-batch size."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def fit(static: Static, peaks: Mapping[int, int], amp: str | None = None,
        world_size: int = 1, sharded: bool = False) -> MemoryModel:
    """A memory model from the static part and recorded peaks (micro-batch -> bytes)."""
    points = tuple(sorted((int(m), int(p)) for m, p in peaks.items()))
    if not points:
        return MemoryModel(static, _held(static, world_size, sharded), None, (), amp,
                           world_size, sharded)
    if len(points) == 1:
        micro, peak = points[0]
        held = _held(static, world_size, sharded)
        slope = max(peak - held, 0) / micro
        return MemoryModel(static, held, slope, points, amp, world_size, sharded)
    _, slope = fit_line(list(points))
    slope = max(slope, 0.0)
    intercept = max(peak - slope * micro for micro, peak in points)
    return MemoryModel(static, intercept, slope, points, amp, world_size, sharded)


def _held(static: Static, world_size: int, sharded: bool) -> int:
    """The static bytes one GPU holds: all of them, or its share under FSDP."""
    return math.ceil(static.total / world_size) if sharded else static.total


def from_manifest(manifest: Mapping[str, Any]) -> MemoryModel:
    """The memory model of a snapshot: exact static part, activations from its peaks."""
    static = static_bytes(manifest.get("tensors", {}))
    raw = (manifest.get("memory") or {}).get("peak_bytes_by_micro_batch") or {}
    peaks = {}
    for micro, peak in raw.items():
        if not (str(micro).isdigit() and int(micro) > 0 and isinstance(peak, int)
                and not isinstance(peak, bool) and peak > 0):
            raise SnapshotError(f"snapshot memory profile has a malformed entry "
                                f"{micro!r}: {peak!r}")
        peaks[int(micro)] = peak
    batch = manifest.get("batch") or {}
    amp = (manifest.get("amp") or {}).get("dtype")
    return fit(static, peaks, amp, int(batch.get("world_size") or 1),
               sharded=batch.get("sharded") is True)

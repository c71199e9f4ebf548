"""Memory control before the OOM: shrink the micro-batch at a step boundary, grow it back.

The run reads the card after every optimizer step (a *reader*: peak bytes of that step and
the card's size). When the peak passes the target (default 85% of the card, the articles'
``safety_margin``), or a memory alert was raised, the next step runs a smaller micro-batch
and more accumulation; after several steps predicted to fit at a larger size it grows back,
never past the target and never past the micro-batch the run was planned with. The global
batch never changes, and the candidates are the planner's exact splits, so every step
consumes the same samples as a run that never changed.

Prediction: ``peak(m) = reading + slope * (m - current)``, anchored at the newest reading
because the static part drifts (fragmentation, another process on the card). For the same
reason the slope (bytes per sample of a micro-batch) is not a least-squares line over all
readings, as the planner's ``burst.plan.memory.fit`` draws for a fresh card: readings taken
minutes apart would mix the drift into it. It comes from the two readings on either side of
each switch (one step apart, so little drift), the largest such estimate, and never more
than ``peak / micro`` (all of the peak proportional), which is also what it is before any
switch: that over-predicts growth (safe) and makes a shrink converge over a few boundaries.

Rules (``"memory > 80%: amp=bf16"``) are parsed here and fire once, at the first boundary
whose reading passes their threshold; the run applies their action.

This module is pure (readings in, decisions out) apart from the default CUDA reader.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from burst.errors import ConfigError
from burst.plan.planner import micro_batches

DEFAULT_TARGET = 0.85
DEFAULT_GROW_AFTER = 3  # consecutive boundaries predicted to fit before growing back
EVENT = "memory-replan"
RULE_EVENT = "memory-rule"


@dataclass(frozen=True)
class Reading:
    """One step's peak bytes on the card and the card's size, in bytes."""

    peak: int
    total: int

    @property
    def fraction(self) -> float:
        return self.peak / self.total if self.total else 0.0


Reader = Callable[[], "Reading | None"]


def cuda_reader() -> Reading | None:
    """The last step's peak on the current CUDA device, then reset for the next step.

    ``peak`` is what this process allocated (``max_memory_allocated``); ``total`` what it
    may use: the card less what other processes hold (total - free - this process's
    reserved pool), or its cap (``set_per_process_memory_fraction``) if that is lower.
    None without CUDA (or before CUDA was used)."""
    import torch

    if not torch.cuda.is_initialized():  # a cheap flag: every step asks
        return None
    free, card = torch.cuda.mem_get_info()
    others = max(card - free - torch.cuda.memory_reserved(), 0)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = get_fraction() if get_fraction is not None else 1.0
    room = min(int(card * fraction), card - others)
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return Reading(int(peak), int(room))


@dataclass(frozen=True)
class Decision:
    """Switch from ``old`` to ``new`` micro-batch, and why."""

    old: int
    new: int
    reason: str  # "over-target", "predicted-over-target", "alert", "headroom"
    reading: Reading | None
    predicted: int | None  # bytes predicted at ``new``


@dataclass(frozen=True)
class Rule:
    """``memory > threshold: key=value`` (threshold a fraction of the card)."""

    threshold: float
    key: str  # "amp" or "activation_checkpointing"
    value: str
    text: str


_RULE = re.compile(r"^\s*memory\s*>\s*([0-9.]+)\s*%\s*:\s*([a-z_]+)\s*=\s*(.+?)\s*$")
RULE_KEYS = ("amp", "activation_checkpointing")


def parse_rule(text: str) -> Rule:
    """Parse ``"memory > 80%: amp=bf16"``; a bad rule is a one-line ConfigError."""
    match = _RULE.match(text)
    if not match:
        raise ConfigError(f"memory rule {text!r}: expected 'memory > N%: key=value'")
    percent, key, value = float(match[1]), match[2], match[3]
    if not 0 < percent <= 100:
        raise ConfigError(f"memory rule {text!r}: the threshold must be in (0, 100]%")
    if key not in RULE_KEYS:
        raise ConfigError(f"memory rule {text!r}: unknown action {key!r} "
                          f"(use {' or '.join(RULE_KEYS)})")
    return Rule(percent / 100, key, value, text.strip())


def candidates(global_batch: int, world_size: int, planned: int) -> list[int]:
    """Micro-batches the run may switch to, largest first: the planner's exact splits of
    the per-rank share that also divide the planned one (the loader's batch is re-chunked,
    so every loader batch splits into whole micro-batches)."""
    return [m for m in micro_batches(global_batch, world_size) if m <= planned and planned % m == 0]


class Controller:
    """Decides the micro-batch at each step boundary from the readings."""

    def __init__(self, planned: int, sizes: Sequence[int], target: float = DEFAULT_TARGET,
                 grow_after: int = DEFAULT_GROW_AFTER, rules: Sequence[str] = ()) -> None:
        if not 0 < target <= 1:
            raise ConfigError(f"memory_target is a fraction of the card (0.85), got {target!r}")
        self.planned, self.sizes = planned, sorted(sizes, reverse=True)
        self.target, self.grow_after = target, grow_after
        self.rules = [parse_rule(r) for r in rules]
        self.slopes: list[float] = []  # bytes per sample, from the readings around a switch
        self._last: tuple[int, int] | None = None  # (micro-batch, peak) of the last reading
        self._fitting = 0  # consecutive boundaries with headroom at a larger size
        self._alert = threading.Event()  # set from a watcher thread, read at a boundary

    def alert(self) -> None:
        """A memory alert fired (e.g. the GPU watch): shrink at the next boundary."""
        self._alert.set()

    @property
    def alerted(self) -> bool:
        """An alert is waiting for the next boundary."""
        return self._alert.is_set()

    def predict(self, micro: int, current: int, reading: Reading) -> int:
        """Peak bytes predicted at ``micro``, anchored at ``reading`` taken at ``current``."""
        return max(int(reading.peak + self._slope(current, reading) * (micro - current)), 0)

    def _slope(self, current: int, reading: Reading) -> float:
        bound = reading.peak / current  # all of it proportional: pessimistic for growth
        return min(max(self.slopes), bound) if self.slopes else bound

    def _learn(self, micro: int, reading: Reading) -> None:
        if self._last is not None and self._last[0] != micro:
            old_micro, old_peak = self._last
            estimate = (reading.peak - old_peak) / (micro - old_micro)
            if estimate > 0:
                self.slopes.append(estimate)
        self._last = (micro, reading.peak)

    def decide(self, micro: int, reading: Reading | None) -> Decision | None:
        """The switch to make before the next step, or None to keep ``micro``."""
        alerted = self._alert.is_set()
        if alerted:  # clearing takes the event's lock: not on every step
            self._alert.clear()
        if reading is None:
            return self._shrink(micro, None, "alert") if alerted else None
        self._learn(micro, reading)
        limit = self.target * reading.total
        if reading.peak > limit or alerted:
            self._fitting = 0
            return self._shrink(micro, reading, "over-target" if reading.peak > limit else "alert")
        larger = [m for m in self.sizes if micro < m <= self.planned
                  and self.predict(m, micro, reading) <= limit]
        if not larger:
            self._fitting = 0
            return None
        self._fitting += 1
        if self._fitting < self.grow_after:
            return None
        self._fitting = 0
        new = max(larger)
        return Decision(micro, new, "headroom", reading, self.predict(new, micro, reading))

    def _shrink(self, micro: int, reading: Reading | None, reason: str) -> Decision | None:
        smaller = [m for m in self.sizes if m < micro]
        if not smaller:
            return None  # already at one sample per micro-batch: nothing left to give
        new = smaller[0]  # at least one size down, further if the prediction says so
        if reading is not None:
            limit = self.target * reading.total
            fitting = [m for m in smaller if self.predict(m, micro, reading) <= limit]
            new = fitting[0] if fitting else smaller[-1]
        predicted = None if reading is None else self.predict(new, micro, reading)
        return Decision(micro, new, reason, reading, predicted)

    def rules_due(self, reading: Reading | None) -> list[Rule]:
        """Rules whose threshold this reading passes, each returned once."""
        if reading is None:
            return []
        due = [r for r in self.rules if reading.fraction > r.threshold]
        self.rules = [r for r in self.rules if r not in due]
        return due


# -- re-chunking: the loader keeps the planned batch; a step splits each into micro-batches --

def micro_count(share: int, loader_batch: int, micro: int) -> int:
    """Micro-batches in a step of ``share`` samples when each loader batch of
    ``loader_batch`` samples is split into pieces of ``micro`` (the last may be shorter)."""
    full, rest = divmod(share, loader_batch)
    return full * -(-loader_batch // micro) + -(-rest // micro)


def rechunk(batches: Iterator[Any], loader_batches: int, micro: int) -> Iterator[Any]:
    """The micro-batches of the next ``loader_batches`` loader batches, in order.

    Pulls a loader batch only when the previous one is used up, so a step never reads
    ahead into the next one (whose micro-batch may differ)."""
    for _ in range(loader_batches):
        yield from split_batch(next(batches), micro)


def split_batch(batch: Any, size: int) -> list[Any]:
    """Split a collated batch along its first dimension into pieces of ``size``.

    Tensors are sliced; dicts, tuples and lists of tensors are split field by field (as
    ``default_collate`` builds them); a list of plain values (strings, numbers) is sliced."""
    length = _length(batch)
    return [_slice(batch, lo, lo + size) for lo in range(0, length, size)]


def _length(batch: Any) -> int:
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        return _length(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch and _is_structure(batch):
        return _length(batch[0])
    if isinstance(batch, list | tuple):
        return len(batch)
    raise ConfigError(f"cannot re-chunk a batch of type {type(batch).__name__} into "
                      "smaller micro-batches: pass memory_target=None")


def _is_structure(batch: list | tuple) -> bool:
    return all(hasattr(b, "shape") or isinstance(b, Mapping | list | tuple) for b in batch)


def _slice(batch: Any, lo: int, hi: int) -> Any:
    if hasattr(batch, "shape"):
        return batch[lo:hi]
    if isinstance(batch, Mapping):
        # the batch's own mapping type (dict, a tokenizer's BatchEncoding) made from a dict
        return type(batch)({k: _slice(v, lo, hi) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, list | tuple) and batch and _is_structure(batch):
        parts = [_slice(b, lo, hi) for b in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    return batch[lo:hi]

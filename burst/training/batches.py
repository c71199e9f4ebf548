"""Optimizer steps from a batch source burst calls, for loops without a DataLoader.

nanoGPT draws each batch with ``torch.randint`` offsets into a memory-mapped token file,
and draws the next one right after ``loss.backward()``, ahead of the step that uses it.
A snapshot at the step boundary then holds the generators *after* that draw, but not the
batch drawn: the resumed run draws another one there, and from then on every loss
differs. ``Run.batches(get_batch)`` owns the source instead:

- each micro-batch is drawn inside its step, from a random stream of the source's own
  (:mod:`burst.state.streams`): ``get_batch`` keeps calling ``torch.randint`` as it
  always did, but those draws never move the generators dropout uses;
- batches may be drawn ahead (``prefetch``, one by default, as nanoGPT does), across a
  step boundary too: the snapshot keeps the stream as it was before the first batch not
  yet consumed (:mod:`burst.state.carry`), so the resumed run draws that batch again,
  the same;
- with ``over`` (a sequence of keys: the bptt offsets of a language model's token
  stream), ``source(key)`` is called for each key in order and the snapshot keeps the
  position, so a resumed run continues at the next key of the epoch.

:class:`OutsideDraws` is the warning for a loop that still draws outside its steps.
"""

from __future__ import annotations

import collections
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from burst.errors import ConfigError
from burst.state import rng
from burst.state.carry import LoopState
from burst.state.rng import derive_seed
from burst.state.streams import Stream
from burst.training.step import Step, hand_out

OUTSIDE_EVENT = "rng-outside-step"  # recorded once a run, with the warning's text
DOCS = "docs/own-loop.md"


class OutsideDraws:
    """Says, once a run, that random numbers were drawn between two steps.

    The run marks the generators (:class:`burst.state.rng.Fingerprint`) when ``attach``
    returns and when a step ends, and checks at the next step's start. A draw in between
    is one a snapshot at that boundary holds as its effect on the generators but not as
    what was drawn: a resumed run draws something else there (nanoGPT's ``get_batch``
    after ``backward``, a ``torch.randn`` batch made between two steps). Once said, it
    stops looking: a warning repeated every step helps nobody, and the check then costs
    nothing."""

    def __init__(self) -> None:
        self._fingerprint = rng.Fingerprint()
        self.said: str | None = None
        self._after = "attach()"

    def mark(self, after: str) -> None:
        if self.said is None:
            self._after = after
            self._fingerprint.mark()

    def check(self, step: int) -> str | None:
        """The warning's text when something drew since the mark (said once), else None."""
        if self.said is not None or not self._fingerprint.moved():
            return None
        self.said = (
            f"burst: random numbers were drawn after {self._after} and before step {step} "
            "began (a batch drawn ahead, after backward?). A snapshot at that boundary "
            "holds the generators but not what was drawn, so a resumed run draws "
            "something else there and is no longer the same run. Draw inside the step, "
            f"or let burst call the batch source: run.batches(get_batch) (see {DOCS}).")
        warnings.warn(self.said, RuntimeWarning, stacklevel=3)
        return self.said


class Source:
    """A batch source's place in one epoch: keys drawn, batches drawn ahead, its stream."""

    def __init__(self, fn: Callable[..., Any], keys: Sequence[Any] | None, stream: Stream,
                 position: int, prefetch: int) -> None:
        self.fn, self.keys, self.stream, self.prefetch = fn, keys, stream, prefetch
        self.drawn = position  # keys (or calls) drawn so far in this epoch
        self.ahead: collections.deque[tuple[dict[str, Any], Any]] = collections.deque()

    @property
    def consumed(self) -> int:
        return self.drawn - len(self.ahead)

    def take(self, limit: int | None) -> Any:
        """The next batch (drawn now unless drawn ahead), then draw ahead up to ``limit``."""
        if not self.ahead:
            self._draw()
        _, batch = self.ahead.popleft()
        while len(self.ahead) < self.prefetch and (limit is None or self.drawn < limit):
            self._draw()
        return batch

    def boundary(self, epoch: int) -> dict[str, Any]:
        """The place a snapshot keeps: the stream as it was before the first batch drawn
        ahead, if any (that batch is then drawn again on resume)."""
        stream = self.ahead[0][0] if self.ahead else self.stream.state
        return {"epoch": epoch, "position": self.consumed, "stream": stream}

    def _draw(self) -> None:
        before = self.stream.state
        with self.stream.drawing():
            batch = self.fn() if self.keys is None else self.fn(self.keys[self.drawn])
        self.ahead.append((before, batch))
        self.drawn += 1


def steps(run: Any, fn: Callable[..., Any], *, over: Any = None, steps: int | None = None,
          prefetch: int = 1) -> Iterator[Step]:
    """``Run.batches``: see there. ``run`` is the :class:`burst.training.run.Run`."""
    loop = _check(run, fn, steps, prefetch)
    keys = None if over is None else over if isinstance(over, Sequence) else list(over)
    source = _resume(run, loop, fn, keys, prefetch)
    accumulation = run.accumulation
    if keys is not None:
        run.steps_per_epoch = math.ceil(len(keys) / accumulation)
    while steps is None or run.step < steps:
        count = accumulation if keys is None else min(accumulation,
                                                      len(keys) - source.consumed)
        if count <= 0:
            return
        limit = _limit(run, source, keys, steps)
        run.begin_step()
        current = Step(run.step + 1, run.epoch, count * run.micro_batch * run.world_size,
                       count, _micro_batches(run, source, count, limit), None, run.world_size)
        yield from hand_out(current, functools.partial(_end, run, loop, source, current),
                            run.abandon_step, lambda: run.optimizer_stepped)


def _check(run: Any, fn: Callable[..., Any], steps: int | None, prefetch: int) -> LoopState:
    if not callable(fn):
        raise ConfigError("run.batches() takes the function that draws one micro-batch, "
                          "e.g. run.batches(lambda: get_batch('train'))")
    if run.world_size > 1:
        raise ConfigError("run.batches() draws on one process; on several ranks use a "
                          "DataLoader with burst.ResumableSampler")
    if steps is not None and (not isinstance(steps, int) or steps < 0):
        raise ConfigError(f"steps= is the run's total of optimizer steps, got {steps!r}")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigError(f"prefetch= is how many micro-batches to draw ahead, got "
                          f"{prefetch!r}")
    loop = run.components.loop
    if run.components.model is None or loop is None:
        raise ConfigError("call run.attach(model, ...) before run.batches()")
    return loop


def _resume(run: Any, loop: LoopState, fn: Callable[..., Any], keys: Sequence[Any] | None,
            prefetch: int) -> Source:
    """The source at the run's place: the snapshot's (or the last step's) position in
    this epoch, and its stream; a run that never drew starts a stream from its seed."""
    seed = derive_seed("batches", run.seed, bits=63)
    place = loop.batches
    if place is None:
        position = run.samples_in_epoch // run.micro_batch if keys is not None else 0
        if position:
            warnings.warn("burst: the snapshot holds no batch source position; "
                          f"continuing at key {position} of the epoch with a fresh random "
                          "stream", RuntimeWarning, stacklevel=3)
        return Source(fn, keys, Stream(seed), position, prefetch)
    position = place["position"] if place["epoch"] == run.epoch and keys is not None else 0
    if keys is not None and position > len(keys):
        raise ConfigError(f"the snapshot is at key {position} of the epoch, but over= has "
                          f"only {len(keys)}: the data differs from the snapshot's")
    return Source(fn, keys, Stream(seed, place["stream"]), position, prefetch)


def _limit(run: Any, source: Source, keys: Sequence[Any] | None,
           steps: int | None) -> int | None:
    """How many keys (or calls) the run will ever consume: nothing is drawn past it."""
    if keys is not None:
        return len(keys)
    if steps is None:
        return None
    return source.consumed + (steps - run.step) * run.accumulation


def _micro_batches(run: Any, source: Source, count: int, limit: int | None
                   ) -> Iterator[Any]:
    for index in range(count):
        run.before_micro_batch(index)  # BURST_FAULT drills
        yield source.take(limit)


def _end(run: Any, loop: LoopState, source: Source, step: Step) -> None:
    loop.batches = source.boundary(run.epoch)  # what the step-end snapshot keeps
    run.end_step(step.samples)

"""How often to copy the state to RAM and to persist it, chosen from what both cost.

The CheckFreq idea, done for a whole run: burst measures what a step takes, what a RAM
shadow copy costs the training loop, and what a persist costs, and picks the two
intervals that keep burst's share of the run's time under a budget (1% by default) while
losing as little as possible on a failure.

What a persist costs is what the *training* loses to it, not the background write's own
time: the persister runs at idle priority (:mod:`burst.snapshot.priority`), so a write of
seconds may cost the steps beside it nothing, or on a host it competes with more than its
own time. Steps that ran while a persist was under way are compared with the steps that
ran without one; their excess over the quiet step time, summed over one persist, is its
cost (its *slowdown*). Until a persist has been measured that way (no quiet step time
yet), its own time stands in.

Two failures, two intervals. A SIGKILL (or a lost machine) loses everything since the
last persisted snapshot: on average half the persist interval, plus the time the persist
itself takes. A GPU failure or an OOM leaves the process alive, so it loses only the work
since the last RAM shadow: half the shadow interval. With costs ``c_p`` and ``c_s`` per
persist and per shadow, minimising the sum of the two expected losses under
``c_p / T_p + c_s / T_s <= budget`` gives (Lagrange) ``T_i = sqrt(c_i) * (sqrt(c_p) +
sqrt(c_s)) / budget``: each interval grows with the square root of its own cost, and the
budget is spent exactly.

Before anything is measured the policy takes a shadow copy at the first step boundary
(measuring it) and persists once the run has trained ten seconds, so a run killed in its
first minute still leaves a snapshot; that first persist is what it measures next. Every figure is a moving average, so intervals follow a run whose steps or
state change; the policy never reads a clock it was not given (tests inject one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

AUTO = "auto"  # an interval the run chooses (the default)
DEFAULT_BUDGET = 0.01  # of training time
MIN_PERSIST_SECONDS = 2.0  # shorter saves little and churns the disk
MAX_PERSIST_SECONDS = 3600.0
MAX_SHADOW_EVERY = 10_000
FIRST_PERSIST_SECONDS = 10.0  # of training before the first persist (then it is measured)
UNMEASURED_PERSIST_SECONDS = 60.0  # the second persist, if the first has not measured yet
_SMOOTHING = 0.2  # weight of a new measurement in the moving averages


@dataclass(frozen=True)
class Intervals:
    """The chosen intervals and what they were chosen from (seconds unless named)."""

    shadow_every: int  # steps between RAM shadow copies
    persist_seconds: float | None  # between persisted snapshots (None: none timed)
    expected_loss_seconds: float | None  # of training a SIGKILL loses, on average
    step_seconds: float | None
    shadow_cost: float | None
    persist_cost: float | None  # what a persist costs training (its slowdown, once measured)
    budget: float
    chosen: bool  # the persist interval was chosen by burst (not the user's)
    persist_seconds_taken: float | None = None  # the persister's own time per persist

    def as_dict(self) -> dict[str, float | int | None]:
        """Rounded, for a snapshot's meta and the ``snapshot-intervals`` event."""
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class Adaptive:
    """Chooses the shadow and persist intervals of a run from measured costs.

    The run reports what it measured (``step``, ``shadow``, ``persist``) and asks
    ``shadow_due`` and ``persist_due`` at each step boundary; ``intervals`` says what is
    in force. The user's explicit choices are never changed: ``shadow_every`` (None:
    chosen), and with ``persist_chosen=False`` the persist interval ``persist_seconds``
    (None: no timed persists, e.g. when the user persists every N steps instead).
    """

    def __init__(self, budget: float = DEFAULT_BUDGET, *, shadow_every: int | None = None,
                 persist_seconds: float | None = None, persist_chosen: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"the overhead budget is a fraction of training time, got {budget}")
        self.budget = budget
        self.fixed_shadow_every, self.fixed_persist_seconds = shadow_every, persist_seconds
        self.persist_chosen = persist_chosen
        self.clock = clock
        self.step_seconds: float | None = None
        self.trained = 0.0  # seconds of training measured so far
        self.shadow_cost: float | None = None
        self.write_seconds: float | None = None  # the persister's own time per persist
        self.slowdown: float | None = None  # the training time a persist cost the steps
        self._overlap_lost = 0.0  # excess of the steps beside the persist under way
        self._overlap_steps = 0
        self.last_persist = clock()  # clock time of the last persist (or of the start)
        self._chosen: Intervals | None = None  # until a measurement moves it
        self.persists = 0

    # -- measurements ---------------------------------------------------------------------

    @property
    def persist_cost(self) -> float | None:
        """What a persist costs training: its measured slowdown, else its own time."""
        return self.slowdown if self.slowdown is not None else self.write_seconds

    def step(self, seconds: float, persisting: bool = False) -> None:
        """One optimizer step took ``seconds`` of training (burst's own work excluded);
        ``persisting``: a persist was under way during it (its excess over the quiet
        step time is charged to that persist, and it does not move the step time)."""
        self.trained += max(seconds, 0.0)
        if persisting and self.step_seconds is not None:
            self._overlap_lost += seconds - self.step_seconds
            self._overlap_steps += 1
            return
        self.step_seconds = _average(self.step_seconds, seconds)
        chosen = self._chosen  # re-chosen once the step time moved by a quarter: not on
        if chosen is not None and chosen.step_seconds and not (  # every noisy step
                _KEEP_LOW < self.step_seconds / chosen.step_seconds < _KEEP_HIGH):
            self._chosen = None

    def shadow(self, seconds: float) -> None:
        """A shadow copy cost the training loop ``seconds``."""
        self.shadow_cost = _average(self.shadow_cost, seconds)
        self._chosen = None

    def persist(self, seconds: float) -> None:
        """A persist took ``seconds`` of background work (hash, write, commit); the steps
        reported ``persisting`` since the last one are what it cost training (call this
        after the step it finished in)."""
        self.write_seconds = _average(self.write_seconds, seconds)
        if self._overlap_steps:
            self.slowdown = _average(self.slowdown, self._overlap_lost)
        self._overlap_lost, self._overlap_steps = 0.0, 0
        self._chosen = None

    def persisted(self) -> None:
        """A persist was just queued (whatever asked for it): the interval restarts."""
        self.last_persist = self.clock()
        self.persists += 1

    # -- decisions ------------------------------------------------------------------------

    def shadow_due(self, step: int) -> bool:
        return step % self.intervals().shadow_every == 0

    def persist_due(self, interval: float | None = None) -> bool:
        """Whether the persist interval (``interval``: this one instead, e.g. shortened on
        a spot node) has run out. A chosen interval persists first once the run has
        trained ``FIRST_PERSIST_SECONDS`` (so a run killed in its first minute still
        leaves a snapshot), and that persist is what the later intervals are chosen from."""
        if self.persist_chosen and not self.persists:
            return self.trained >= FIRST_PERSIST_SECONDS
        if interval is None:
            interval = self.intervals().persist_seconds
        return interval is not None and self.clock() - self.last_persist >= interval

    def intervals(self) -> Intervals:
        """The intervals in force (recomputed only when a measurement moved)."""
        if self._chosen is None or self._chosen.step_seconds is None:
            self._chosen = self._compute()
        return self._chosen

    def _compute(self) -> Intervals:
        shadow_seconds, chosen = self._chosen_seconds()
        shadow_every = self.fixed_shadow_every or _steps(shadow_seconds, self.step_seconds)
        persist = chosen if self.persist_chosen else self.fixed_persist_seconds
        # a kill loses half an interval and the write under way (its own time)
        loss = None if persist is None else persist / 2 + (self.write_seconds or 0.0)
        return Intervals(shadow_every=shadow_every, persist_seconds=persist,
                         expected_loss_seconds=loss, step_seconds=self.step_seconds,
                         shadow_cost=self.shadow_cost, persist_cost=self.persist_cost,
                         budget=self.budget, chosen=self.persist_chosen,
                         persist_seconds_taken=self.write_seconds)

    def _chosen_seconds(self) -> tuple[float | None, float]:
        """(shadow interval, persist interval) in seconds from the costs measured so far."""
        if self.shadow_cost is None:
            return None, UNMEASURED_PERSIST_SECONDS
        if self.persist_cost is None or self.write_seconds is None:  # still being written
            return 2 * self.shadow_cost / self.budget, UNMEASURED_PERSIST_SECONDS
        # a persist also takes a shadow copy on the loop, then slows the steps beside it
        persist_cost = self.persist_cost + self.shadow_cost
        both = math.sqrt(persist_cost) + math.sqrt(self.shadow_cost)
        persist = math.sqrt(persist_cost) * both / self.budget
        shadow = math.sqrt(self.shadow_cost) * both / self.budget
        # never shorter than a write takes: persists would only queue up behind it
        return shadow, min(max(persist, MIN_PERSIST_SECONDS, self.write_seconds),
                           MAX_PERSIST_SECONDS)


_KEEP_LOW, _KEEP_HIGH = 0.8, 1.25  # a step time within these of the chosen one keeps it


def _steps(seconds: float | None, step_seconds: float | None) -> int:
    """An interval in whole steps (every step until both figures are known)."""
    if seconds is None or not step_seconds:
        return 1
    return max(1, min(MAX_SHADOW_EVERY, math.ceil(seconds / step_seconds)))


def _average(previous: float | None, value: float) -> float:
    value = max(value, 0.0)
    return value if previous is None else (1 - _SMOOTHING) * previous + _SMOOTHING * value

"""When to ask for another node, and when to give one back: the scale-out rule of
``burst run --scale-out "memory > 80% for 5m: +1 node, max 4"``.

FSDP shards weights, gradients and optimizer state over the ranks, so a run whose GPU
memory stays high gets room by growing the world, not by shrinking its batch. The rule is
parsed once (a bad rule is a one-line ConfigError before anything starts) and decided as a
pure function of memory samples and the clock, so it is specified with synthetic and
modelled traces; :class:`ScaleMonitor` is the little state the agent keeps between
decisions (the samples seen, the last change) and the ``scale-request`` it records.

Adding or removing the node itself is the elastic membership work's: the monitor asks,
through the run's events, and counts the size it asked for until told otherwise
(:meth:`ScaleMonitor.resized`).

The rule, by design:

- out only once memory has stayed above the threshold for the whole window (one sample
  below restarts the clock), one node at a time, never past ``max``;
- after any change, nothing is decided for a settle period (the run reshards, its memory
  moves), and samples from before the run settled do not count toward a window;
- in when memory, scaled to one node fewer, has stayed below the threshold minus a
  hysteresis for the window and there are more nodes than ``min``. The scaling is
  ``n/(n-1)``, as if every byte were sharded (FSDP's weights, gradients and optimizer
  state are; the activations of an unchanged micro-batch are not): an upper bound, so a
  node given back never pushes the run straight over the line, and a run hovering at the
  threshold does not flap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from burst.errors import ConfigError

SCALE_POLICY_EVENT = "scale-policy"
SCALE_REQUEST_EVENT = "scale-request"
DEFAULT_HYSTERESIS = 0.2  # in when below threshold - this, e.g. 60% for an 80% rule

Sample = tuple[float, float]  # (seconds on the monitor's clock, fraction of the card used)

_UNITS = {"s": 1, "m": 60, "h": 3600}
_DURATION = r"\d+(?:\.\d+)?\s*[smh]"
_RULE = re.compile(
    rf"memory\s*>\s*(?P<pct>\d+(?:\.\d+)?)\s*%\s+for\s+(?P<window>{_DURATION})\s*:"
    r"\s*\+\s*(?P<add>\d+)\s*nodes?\s*(?P<rest>(?:,.*)?)", re.IGNORECASE)
_BOUND = re.compile(rf"(?P<key>max|min|settle)\s+(?P<value>\d+|{_DURATION})", re.IGNORECASE)
EXAMPLE = '"memory > 80% for 5m: +1 node, max 4" (optional: min N, settle 10m)'


class Action(str, Enum):
    """What the policy asks of the run's membership (a str: events hold the value)."""

    NONE = "none"
    OUT = "out"  # add a node
    IN = "in"  # give one back

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    nodes: int  # the node count the decision asks for (unchanged for NONE)


@dataclass(frozen=True)
class ScalePolicy:
    """A parsed scale-out rule; :meth:`decide` is pure."""

    threshold: float  # fraction of the card's memory, e.g. 0.8
    window_s: float  # how long memory must stay past a line before a change
    maximum: int
    minimum: int = 1
    settle_s: float | None = None  # None: one window
    hysteresis: float = DEFAULT_HYSTERESIS
    text: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ConfigError(f"scale-out threshold must be between 0% and 100%, got "
                              f"{self.threshold:.0%}")
        if self.minimum < 1 or self.maximum < self.minimum:
            raise ConfigError(f"scale-out needs 1 <= min <= max, got min {self.minimum}, "
                              f"max {self.maximum}")

    @property
    def settle(self) -> float:
        return self.window_s if self.settle_s is None else self.settle_s

    @property
    def low(self) -> float:
        """The line memory, scaled to one node fewer, must stay under before one goes."""
        return max(self.threshold - self.hysteresis, 0.0)

    def low_at(self, nodes: int) -> float:
        """The line as measured on ``nodes`` nodes: ``low`` once ``n/(n-1)`` larger."""
        return self.low * (nodes - 1) / nodes if nodes > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The policy as the ``scale-policy`` event records it."""
        return {"rule": self.text, "threshold": self.threshold, "window_seconds": self.window_s,
                "min": self.minimum, "max": self.maximum, "settle_seconds": self.settle,
                "low": round(self.low, 6)}

    def decide(self, samples: Sequence[Sample], now: float, nodes: int,
               changed_at: float | None = None) -> Decision:
        """What to do now, given memory samples (oldest first), the node count and when the
        membership last changed (None: never)."""
        if changed_at is not None and now - changed_at < self.settle:
            return Decision(Action.NONE, f"settling after a change ({_human(now - changed_at)}"
                            f" of {_human(self.settle)})", nodes)
        if nodes < self.minimum:
            return Decision(Action.OUT, f"{nodes} node(s), below min {self.minimum}", nodes + 1)
        counted = [s for s in samples if changed_at is None or s[0] >= changed_at + self.settle]
        high = _held(counted, now, lambda used: used > self.threshold)
        if high is not None and high >= self.window_s:
            peak = max(used for t, used in counted if t >= now - high)
            if nodes >= self.maximum:
                return Decision(Action.NONE, f"memory above {self.threshold:.0%} for "
                                f"{_human(high)}, but already at max {self.maximum} nodes", nodes)
            return Decision(Action.OUT, f"memory above {self.threshold:.0%} for {_human(high)} "
                            f"(peak {peak:.0%}): {nodes} -> {nodes + 1} nodes", nodes + 1)
        line = self.low_at(nodes)
        low = _held(counted, now, lambda used: used < line)
        if low is not None and low >= self.window_s and nodes > self.minimum:
            return Decision(Action.IN, f"memory below {line:.0%} for {_human(low)} (at most "
                            f"{self.low:.0%} on one node fewer): {nodes} -> {nodes - 1} nodes",
                            nodes - 1)
        return Decision(Action.NONE, "no sustained pressure either way", nodes)


def _held(samples: Sequence[Sample], now: float, past: Callable[[float], bool]) -> float | None:
    """How long the newest unbroken run of samples has been past the line (from its first
    sample to ``now``); None when the newest sample is not past it."""
    since = None
    for t, used in reversed(samples):
        if not past(used):
            break
        since = t
    return None if since is None else now - since


def parse(text: str) -> ScalePolicy:
    """``memory > 80% for 5m: +1 node, max 4`` (``min N`` and ``settle 10m`` optional)."""
    match = _RULE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"--scale-out {text!r} is not a scale-out rule: write e.g. {EXAMPLE}")
    if int(match["add"]) != 1:
        raise ConfigError(f"--scale-out adds one node at a time: write +1 node, got "
                          f"+{match['add']}")
    bounds: dict[str, str] = {}
    for part in (p.strip() for p in match["rest"].split(",")[1:]):
        bound = _BOUND.fullmatch(part)
        if bound is None or bound["key"].lower() in bounds:
            raise ConfigError(f"--scale-out: {part!r} is not one of max N, min N, settle "
                              f"DURATION (each once), e.g. {EXAMPLE}")
        bounds[bound["key"].lower()] = bound["value"]
    if "max" not in bounds:
        raise ConfigError(f"--scale-out needs a max node count, e.g. {EXAMPLE}")
    return ScalePolicy(threshold=float(match["pct"]) / 100, window_s=_seconds(match["window"]),
                       maximum=_count(bounds["max"], "max"),
                       minimum=_count(bounds.get("min", "1"), "min"),
                       settle_s=_seconds(bounds["settle"]) if "settle" in bounds else None,
                       text=" ".join(text.split()))


def _seconds(text: str) -> float:
    text = text.strip().lower()
    if text[-1:] not in _UNITS:
        raise ConfigError(f"--scale-out: {text!r} is not a duration: write e.g. 5m, 30s, 1h")
    seconds = float(text[:-1]) * _UNITS[text[-1]]
    if seconds <= 0:
        raise ConfigError(f"--scale-out: a duration must be longer than zero, got {text!r}")
    return seconds


def _count(text: str, what: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"--scale-out: {what} must be a whole number of nodes, got {text!r}")
    return int(text)


def _human(seconds: float) -> str:
    seconds = round(seconds)
    minutes, rest = divmod(seconds, 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


class ScaleMonitor:
    """The agent's side of the rule: keeps the samples one decision needs, decides at each
    reading of the GPUs, and records a ``scale-request`` when the rule asks for a change.

    ``record`` is the agent's event writer; ``nodes`` the size the run starts at."""

    def __init__(self, policy: ScalePolicy, record: Callable[..., Any], nodes: int = 1) -> None:
        self.policy, self.record, self.nodes = policy, record, nodes
        self.samples: list[Sample] = []
        self.changed_at: float | None = None
        self.requests: list[Decision] = []

    def feed(self, used_fractions: Sequence[float], now: float) -> Decision:
        """One reading of the node's GPUs (each one's used fraction): the fullest counts,
        as the first card to run out stops the run."""
        if used_fractions:
            self.samples.append((now, max(used_fractions)))
        # a window's worth after the settle period, and the reading just before it (the
        # first of an unbroken run may be that old)
        horizon = now - self.policy.window_s - self.policy.settle
        older = [s for s in self.samples if s[0] < horizon]
        self.samples = older[-1:] + [s for s in self.samples if s[0] >= horizon]
        decision = self.policy.decide(self.samples, now, self.nodes, self.changed_at)
        if decision.action is not Action.NONE:
            self.record(SCALE_REQUEST_EVENT, action=str(decision.action),
                        reason=decision.reason, nodes=self.nodes, target=decision.nodes)
            self.requests.append(decision)
            self.resized(decision.nodes, now)
        return decision

    def resized(self, nodes: int, now: float) -> None:
        """The membership is (or was asked to be) ``nodes`` as of ``now``: settle first."""
        self.nodes, self.changed_at = nodes, now

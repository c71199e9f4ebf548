"""The overhead budget is spent on what a persist costs training (the steps beside it
slowed down), not on the persister's own time: figures fed by hand, no clock read."""

from __future__ import annotations

import pytest

from burst.training.adaptive import Adaptive


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quiet(policy: Adaptive, steps: int = 10, seconds: float = 0.1) -> Adaptive:
    for _ in range(steps):
        policy.step(seconds)
    return policy


def persisted(policy: Adaptive, step_times: list[float], write_seconds: float) -> Adaptive:
    """One persist under way during ``step_times``, finishing after the last of them."""
    for seconds in step_times:
        policy.step(seconds, persisting=True)
    policy.persist(write_seconds)
    return policy


def test_a_persist_costs_the_excess_of_the_steps_beside_it_over_the_quiet_step():
    policy = quiet(Adaptive(clock=Clock()))
    persisted(policy, [0.15, 0.12, 0.1], write_seconds=2.0)
    assert policy.slowdown == pytest.approx(0.05 + 0.02 + 0.0)
    assert policy.intervals().persist_cost == pytest.approx(0.07)
    assert policy.intervals().persist_seconds_taken == pytest.approx(2.0)


def test_a_persist_that_slows_nothing_buys_a_shorter_interval_than_its_own_time_would():
    free = quiet(Adaptive(clock=Clock()))
    free.shadow(0.002)
    persisted(free, [0.1] * 20, write_seconds=1.0)  # 1 s of writing, no step slower
    charged = quiet(Adaptive(clock=Clock()))
    charged.shadow(0.002)
    charged.persist(1.0)  # no step beside it reported: its own time stands in
    assert free.intervals().persist_seconds < charged.intervals().persist_seconds
    assert free.intervals().persist_seconds >= 1.0  # never shorter than a write takes


def test_a_persist_that_slows_training_more_than_its_own_time_is_charged_that():
    policy = quiet(Adaptive(clock=Clock()))
    persisted(policy, [0.3] * 10, write_seconds=1.0)  # 2 s lost to a 1 s write
    assert policy.persist_cost == pytest.approx(2.0)


def test_steps_beside_a_persist_do_not_move_the_quiet_step_time():
    policy = quiet(Adaptive(clock=Clock()))
    persisted(policy, [0.5] * 30, write_seconds=3.0)
    assert policy.step_seconds == pytest.approx(0.1)


def test_the_steps_before_the_first_quiet_one_set_the_step_time_instead():
    policy = Adaptive(clock=Clock())
    policy.step(0.2, persisting=True)  # nothing to compare with yet
    assert policy.step_seconds == pytest.approx(0.2) and policy.slowdown is None


def test_the_excess_is_charged_once_to_the_persist_it_ran_beside():
    policy = quiet(Adaptive(clock=Clock()))
    persisted(policy, [0.2], write_seconds=1.0)
    persisted(policy, [0.1], write_seconds=1.0)  # the next one slowed nothing
    assert policy.slowdown == pytest.approx(0.8 * 0.1 + 0.2 * 0.0)


def test_a_faster_step_beside_a_persist_is_charged_as_no_cost_not_a_gain():
    policy = quiet(Adaptive(clock=Clock()))
    persisted(policy, [0.05, 0.05], write_seconds=1.0)
    assert policy.slowdown == 0.0

"""Snapshot intervals chosen from measured costs (CheckFreq's idea), driven by a clock the
tests move by hand: no wall time is asserted anywhere."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

import burst
from burst.cli import main as cli_main
from burst.env.freeze import FREEZE_ENV
from burst.errors import ConfigError
from burst.resume.status import intervals_line, run_status
from burst.snapshot import reader
from burst.store import LocalStore
from burst.training.adaptive import FIRST_PERSIST_SECONDS, Adaptive
from burst.training.snapshotter import ENV_PERSIST_SECONDS


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def measured(budget: float = 0.01, **fixed) -> Adaptive:
    policy = Adaptive(budget, clock=Clock(), **fixed)
    policy.step(0.1)
    policy.shadow(0.002)
    policy.persist(0.5)
    return policy


def test_chosen_intervals_spend_the_overhead_budget_and_no_more():
    chosen = measured().intervals()
    persist_share = (0.5 + 0.002) / chosen.persist_seconds
    shadow_share = 0.002 / (chosen.shadow_every * 0.1)
    assert persist_share + shadow_share <= 0.01
    assert persist_share + 0.002 / (max(chosen.shadow_every - 1, 1) * 0.1) > 0.01  # not idle
    assert chosen.expected_loss_seconds == pytest.approx(chosen.persist_seconds / 2 + 0.5)


def test_each_interval_grows_with_the_root_of_its_own_cost():
    cheap, dear = measured(), measured()
    dear.persist(0.5 + 4 * (0.5 + 0.002) / 0.2 - 0.5)  # the average moves to ~4x the cost
    ratio = dear.intervals().persist_seconds / cheap.intervals().persist_seconds
    cost_ratio = (dear.persist_cost + 0.002) / (0.5 + 0.002)
    assert 1 < ratio < cost_ratio  # grows, but more slowly than the cost
    assert dear.intervals().shadow_every >= cheap.intervals().shadow_every


def test_a_bigger_budget_buys_shorter_intervals():
    tight, loose = measured(0.01).intervals(), measured(0.05).intervals()
    assert loose.persist_seconds == pytest.approx(tight.persist_seconds / 5)
    assert loose.shadow_every == math.ceil(tight.shadow_every / 5)


def test_the_first_persist_comes_after_ten_seconds_of_training_not_of_waiting():
    clock = Clock()
    policy = Adaptive(clock=clock)
    clock.now += 3600  # start-up, a restore, a freeze: not training
    steps = 0
    while not policy.persist_due():
        policy.step(0.5)
        steps += 1
    assert steps == math.ceil(FIRST_PERSIST_SECONDS / 0.5)


def test_the_intervals_follow_a_change_of_step_time_by_a_quarter_not_the_drift_below_it():
    policy = measured()
    chosen = policy.intervals()
    for _ in range(40):  # 15% slower: within a machine's drift, the choice stands
        policy.step(0.115)
    assert policy.intervals() is chosen  # not recomputed (a 10% band re-chose it)
    for _ in range(40):  # the steps now take twice as long
        policy.step(0.2)
    assert policy.intervals().shadow_every == pytest.approx(chosen.shadow_every / 2, abs=1)


def test_explicit_intervals_are_never_changed():
    policy = measured(shadow_every=7, persist_seconds=30.0, persist_chosen=False)
    policy.persist(50.0)
    chosen = policy.intervals()
    assert (chosen.shadow_every, chosen.persist_seconds, chosen.chosen) == (7, 30.0, False)
    assert not Adaptive(persist_seconds=None, persist_chosen=False).persist_due()


def train(run: burst.Run, clock: Clock, steps: int, seconds: float) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, optimizer)
    for _ in range(steps):
        run.begin_step()
        model(torch.ones(2, 2)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        clock.now += seconds  # what the step "took"
        run.end_step(2)


def test_a_default_run_persists_after_ten_seconds_of_training_and_says_its_intervals(
        tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    clock = Clock()
    store = LocalStore(tmp_path / "store")
    run = burst.Run("auto", store=store, global_batch=2, clock=clock)
    train(run, clock, steps=4, seconds=3.0)  # 12 s of training: persisted at step 4
    run.flush()
    assert reader.list_steps(store, "auto") == [4]
    train(run, clock, steps=1, seconds=3.0)  # the write is measured: intervals are chosen
    status = run_status(store, "auto")
    chosen = status["intervals"]
    assert chosen["chosen"] is True and chosen["persist_cost"] is not None
    assert chosen["expected_loss_seconds"] >= chosen["persist_seconds"] / 2
    assert "a kill loses" in intervals_line(chosen)
    run.close()


def test_status_says_a_run_shorter_than_its_first_persist_persisted_only_at_close(
        tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    monkeypatch.setenv("COLUMNS", "400")  # one table row, unwrapped
    clock = Clock()
    store = LocalStore(tmp_path / "store")
    run = burst.Run("short", store=store, global_batch=2, clock=clock)
    train(run, clock, steps=3, seconds=2.0)  # 6 s of training: under the first persist's 10
    run.close()
    assert reader.list_steps(store, "short") == [3]  # close() wrote the only snapshot
    shown = CliRunner().invoke(cli_main, ["status", "short", "--store", str(store.root)])
    assert shown.exit_code == 0, shown.output
    assert "a run shorter than that persists only at close()" in shown.output


def test_persist_every_alone_means_no_timed_persists(tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    clock = Clock()
    store = LocalStore(tmp_path / "store")
    run = burst.Run("steps", store=store, global_batch=2, persist_every=3, clock=clock)
    train(run, clock, steps=4, seconds=30.0)  # two minutes, yet no timed persist
    run.flush()
    assert reader.list_steps(store, "steps") == [3]
    assert run.intervals().persist_seconds is None
    run.close()


def test_the_environment_sets_the_persist_cadence_a_script_left_to_burst(tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    monkeypatch.setenv(ENV_PERSIST_SECONDS, "4")
    clock = Clock()
    store = LocalStore(tmp_path / "store")
    run = burst.Run("cadence", store=store, global_batch=2, clock=clock)
    train(run, clock, steps=3, seconds=2.0)  # 6 s: past the operator's 4, under burst's 10
    run.flush()
    assert reader.list_steps(store, "cadence") == [2]
    assert run.intervals().persist_seconds == 4.0
    run.close()


def test_a_persist_interval_the_code_gives_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    monkeypatch.setenv(ENV_PERSIST_SECONDS, "4")
    run = burst.Run("given", store=LocalStore(tmp_path / "store"), global_batch=2,
                    persist_seconds=30.0, clock=Clock())
    assert run.intervals().persist_seconds == 30.0
    run.close()


def test_a_persist_cadence_that_is_not_a_number_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_PERSIST_SECONDS, "often")
    with pytest.raises(ConfigError, match=r"\$BURST_PERSIST_SECONDS must be a number"):
        burst.Run("bad", store=LocalStore(tmp_path / "store"), global_batch=2)

"""The deadline policy: predict the local finish from recorded progress, then stay or burst
(spot while slack remains, on-demand when it runs out)."""

from __future__ import annotations

from datetime import timedelta

from burst import events
from burst.deadline import policy as rules
from tests.helpers.schedule_helpers import T0, at, fresh_store, piecewise, steady, trace

HOUR = 3600.0
MARGIN = rules.Margin(override_s=1800)  # 30 minutes to provision, install and restore


def progress_at(points, seconds, total=10_000, **history):
    store = fresh_store()
    trace(store, "run", points)
    for name, when in history.items():
        events.append(store, "run", name, time=at(when).isoformat())
    return rules.measure(events.read(store, "run"), at(seconds), total_steps=total)


def policy(deadline_h: float, spot=None, on_demand=None, recoveries=1) -> rules.Policy:
    return rules.Policy(T0 + timedelta(hours=deadline_h), MARGIN,
                        rules.CloudPace(spot, on_demand), recoveries)


def test_the_pace_is_steps_per_second_between_snapshots():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    assert progress.step == 1800 and progress.steps_per_second == 0.5
    assert progress.remaining == 8200


def test_the_pace_is_measured_over_the_recent_window_not_the_whole_session():
    progress = progress_at(piecewise((1.0, 3 * HOUR), (0.25, 5 * HOUR)), 5 * HOUR)
    assert progress.steps_per_second == 0.25


def test_events_after_now_are_not_seen():
    progress = progress_at(steady(0.5, 4 * HOUR), HOUR)
    assert progress.step == 1800 and progress.last_snapshot == at(HOUR)


def test_a_run_on_track_stays_local():
    # 10 000 steps at 0.5/s: done 5.6 h after the start, deadline at 8 h
    progress = progress_at(steady(0.5, HOUR), HOUR)
    decision = rules.decide(progress, policy(8, 2.0, 2.0), at(HOUR))
    assert decision.action == rules.STAY
    assert decision.numbers["local_finish"] == at(20_000).isoformat(timespec="seconds")
    assert decision.numbers["local_slack_s"] == 8 * HOUR - 20_000


def test_a_run_whose_slack_is_under_the_margin_bursts():
    # local finish at 5.56 h, deadline 5.8 h: 14 min of slack, less than the 30 min margin
    progress = progress_at(steady(0.5, HOUR), HOUR)
    decision = rules.decide(progress, policy(5.8, 2.0, 2.0), at(HOUR))
    assert decision.bursts and "less than the 30m margin" in decision.reason


def test_spot_is_chosen_while_the_cloud_finish_leaves_slack_for_a_preemption():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    decision = rules.decide(progress, policy(5.8, 2.0, 2.0), at(HOUR))
    # cloud: now + 30 min + 8200 / 2 s = 2.64 h; slack 3.2 h >= 30 min reserve
    assert decision.action == rules.BURST_SPOT and decision.spot
    assert decision.numbers["spot_slack_s"] >= decision.numbers["spot_reserve_s"]


def test_on_demand_is_chosen_when_the_slack_cannot_absorb_a_spot_preemption():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    # cloud at 0.7 steps/s: finish 1 h + 30 min + 3.25 h = 4.75 h; deadline 5.1 h: 21 min slack
    decision = rules.decide(progress, policy(5.1, 0.7, 0.7), at(HOUR))
    assert decision.action == rules.BURST_ON_DEMAND and not decision.spot
    assert 0 < decision.numbers["on_demand_slack_s"] < decision.numbers["spot_reserve_s"]


def test_more_recoveries_demand_more_slack_before_spot():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    one = rules.decide(progress, policy(5.8, 2.0, 2.0, recoveries=1), at(HOUR))
    many = rules.decide(progress, policy(5.8, 2.0, 2.0, recoveries=8), at(HOUR))
    assert (one.action, many.action) == (rules.BURST_SPOT, rules.BURST_ON_DEMAND)


def test_a_deadline_that_cannot_be_met_still_bursts_on_demand_for_the_earliest_finish():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    decision = rules.decide(progress, policy(2, 1.0, 1.0), at(HOUR))
    assert decision.action == rules.BURST_ON_DEMAND and "misses the deadline" in decision.reason


def test_the_run_never_bursts_to_a_cloud_slower_than_itself():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    decision = rules.decide(progress, policy(5.8, 0.3, 0.3), at(HOUR))
    assert decision.action == rules.STAY and "cloud would finish later" in decision.reason


def test_a_run_that_stopped_snapshotting_counts_as_stalled_and_bursts():
    progress = progress_at(steady(0.5, HOUR), HOUR + 30 * 60)
    assert progress.stalled and "no snapshot for 30m" in progress.why_stalled
    decision = rules.decide(progress, policy(30, 2.0, 2.0), at(HOUR + 30 * 60))
    assert decision.action == rules.BURST_SPOT and decision.numbers["local_finish"] is None


def test_a_failure_after_the_last_snapshot_means_the_local_run_is_not_progressing():
    progress = progress_at(steady(0.5, HOUR), HOUR + 60, failure=HOUR + 30)
    assert progress.stalled and "failure" in progress.why_stalled


def test_a_finished_run_needs_nothing():
    progress = progress_at(steady(1.0, HOUR), HOUR, total=3600)
    assert rules.decide(progress, policy(8), at(HOUR)).action == rules.DONE


def test_without_a_total_step_count_the_schedule_only_backs_up():
    progress = progress_at(steady(0.5, HOUR), HOUR, total=None)
    assert rules.decide(progress, policy(8), at(HOUR)).action == rules.BLIND


def test_one_snapshot_is_not_yet_a_pace():
    progress = progress_at([(0, 0)], 60)
    assert rules.decide(progress, policy(8), at(60)).action == rules.WAIT


def test_without_a_planner_figure_the_cloud_is_assumed_as_fast_as_told():
    pace = rules.CloudPace(None, None, "assumed", speedup=3.0)
    assert pace.rates(0.5) == (1.5, 1.5)


def test_the_margin_grows_with_the_snapshot_size():
    small, big = rules.estimate_margin(0), rules.estimate_margin(10_000_000_000)
    assert big.total_s - small.total_s == 10e9 / 20e6 + 10e9 / 50e6


def test_burst_by_gives_the_last_moments_a_stopped_run_could_still_burst():
    progress = progress_at(steady(0.5, HOUR), HOUR)
    latest = rules.burst_by(progress, policy(8, 1.0, 1.0))
    deadline = T0 + timedelta(hours=8)
    assert latest["on_demand"] == deadline - timedelta(seconds=1800 + 8200)
    assert latest["spot"] == latest["on_demand"] - timedelta(seconds=1800)

"""The schedule as a daemon, driven by a simulated clock over synthetic progress traces."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from burst import events
from burst.deadline import policy as rules
from burst.deadline import scheduler as sched
from burst.snapshot import reader
from tests.helpers.schedule_helpers import (
    T0,
    FakeClock,
    at,
    fresh_store,
    piecewise,
    recording,
    steady,
    take,
    trace,
)

HOUR = 3600.0
MINUTE = 60.0
MARGIN = rules.Margin(override_s=30 * MINUTE)


def scheduler(points, deadline_h, *, burster=None, cloud=(2.0, 2.0), total=10_000,
              backup=None, clock=None, window=timedelta(hours=1)):
    """A scheduler over a synthetic trace; returns it, its events and its backup times."""
    history, clock = fresh_store(), clock or FakeClock()
    trace(history, "run", points)
    seen, record = recording()
    backups: list = []

    def fake_backup():
        backups.append(clock.now())
        return sched.BackupResult(True, step=0)

    policy = rules.Policy(T0 + timedelta(hours=deadline_h), MARGIN, rules.CloudPace(*cloud))
    s = sched.Scheduler("run", policy, clock, backup or fake_backup,
                        sched.observer(history, history, "run", total_steps=total,
                                       window=window),
                        record, burster=burster)
    return s, seen, backups


def bursts_of(seen):
    return [f for name, f in seen if name == sched.BURST]


def decisions(seen):
    return [f for name, f in seen if name == sched.DECISION]


class Launches:
    """A burster that records each launch; ``fail_spot``: no spot capacity anywhere."""

    def __init__(self, clock, fail_spot=False):
        self.clock, self.fail_spot, self.calls = clock, fail_spot, []

    def __call__(self, run_id, spot):
        self.calls.append((self.clock.now(), spot))
        return 1 if spot and self.fail_spot else 0


def test_the_cadence_halves_whenever_it_exceeds_an_eighth_of_the_time_left():
    every, floor = timedelta(minutes=30), timedelta(minutes=5)
    assert sched.interval(timedelta(hours=10), every, floor) == every
    assert sched.interval(timedelta(hours=2), every, floor) == timedelta(minutes=15)
    assert sched.interval(timedelta(hours=1), every, floor) == timedelta(minutes=7, seconds=30)
    assert sched.interval(timedelta(minutes=20), every, floor) == floor


def test_a_floor_above_every_never_lengthens_the_cadence():
    assert sched.interval(timedelta(hours=1), timedelta(minutes=2),
                          timedelta(minutes=5)) == timedelta(minutes=2)


def test_the_timeline_tightens_towards_the_deadline_and_stops_before_it():
    moments = sched.timeline(T0, T0 + timedelta(hours=6))
    gaps = [b - a for a, b in itertools.pairwise(moments)]
    assert gaps[0] == timedelta(minutes=30) and gaps[-1] == timedelta(minutes=5)
    assert gaps == sorted(gaps, reverse=True) and moments[-1] < T0 + timedelta(hours=6)


def test_backups_happen_at_the_planned_times():
    s, seen, backups = scheduler(steady(0.1, 6 * HOUR), 6, total=None)
    assert s.run() == "deadline"
    assert backups == sched.timeline(T0, T0 + timedelta(hours=6))
    recorded = [f["time"] for name, f in seen if name == sched.BACKUP]
    assert recorded == [m.isoformat(timespec="milliseconds") for m in backups]


def test_a_backup_pushes_the_newest_snapshot_and_the_environment_record():
    local, remote = fresh_store(), fresh_store()
    take(local, 10)
    take(local, 20)
    local.put("run/env/lockfile.json", b"{}")
    result = sched.backup(local, remote, "run")
    assert result.ok and result.new and result.step == 20 and result.env == "present"
    assert reader.list_steps(remote, "run") == [20]
    assert remote.get("run/env/lockfile.json") == b"{}"
    assert not sched.backup(local, remote, "run").new  # already there: nothing re-sent


def test_a_failed_backup_is_recorded_and_the_schedule_goes_on():
    local, remote = fresh_store(), fresh_store()  # no snapshot yet: every backup fails
    s, seen, _ = scheduler(steady(0.1, HOUR), 1, total=None,
                           backup=lambda: sched.backup(local, remote, "run"))
    assert s.run() == "deadline"
    failed = [f for name, f in seen if name == sched.BACKUP]
    assert len(failed) > 3 and all(not f["ok"] and "no snapshot" in f["error"] for f in failed)


def test_a_run_on_track_never_bursts():
    # 10 000 steps at 0.5/s finish at 5.6 h; the deadline is at 8 h
    clock = FakeClock()
    launches = Launches(clock)
    s, seen, _ = scheduler(steady(0.5, 8 * HOUR), 8, burster=launches, clock=clock)
    s.run()
    assert bursts_of(seen) == [] and launches.calls == []
    assert {d["action"] for d in decisions(seen)} <= {rules.STAY, rules.WAIT, rules.DONE}


def test_a_run_on_track_ends_its_schedule_when_it_finishes():
    s, seen, _ = scheduler(steady(0.5, 8 * HOUR), 8)
    assert s.run() == "finished"
    assert s.clock.now() >= at(20_000) and decisions(seen)[-1]["action"] == rules.DONE


def test_a_run_falling_behind_bursts_once_its_predicted_finish_crosses_the_margin():
    # 0.5 steps/s for 2 h (on track for 7 h), then 0.2 steps/s: the rest would take 8.9 h
    points = piecewise((0.5, 2 * HOUR), (0.2, 12 * HOUR))
    clock = FakeClock()
    launches = Launches(clock)
    s, seen, _ = scheduler(points, 7, burster=launches, clock=clock)
    assert s.run() == "burst"
    ((when, _),) = launches.calls
    assert 2 * HOUR < (when - T0).total_seconds() <= 3 * HOUR  # within the pace window
    before, at_burst = decisions(seen)[-2:]
    assert before["action"] == rules.STAY and at_burst["action"] == rules.BURST_SPOT
    deadline = T0 + timedelta(hours=7)
    for fields, crossed in ((before, False), (at_burst, True)):
        finish = deadline - timedelta(seconds=fields["local_slack_s"])
        assert (finish + timedelta(minutes=30) > deadline) is crossed


def test_a_run_that_stops_bursts_at_the_first_tick_after_it_is_seen_stalled():
    # snapshots every 5 min until 1 h, then nothing: stalled 20 min later
    clock = FakeClock()
    launches = Launches(clock)
    s, _, _ = scheduler(steady(0.5, HOUR), 30, burster=launches, clock=clock)
    s.run()
    ((when, spot),) = launches.calls
    assert spot and when == at(HOUR + 30 * MINUTE)  # ticks every 30 min; stall seen at 1h20


def test_spot_is_used_while_slack_remains_and_on_demand_after():
    # the run stops at 1 h with 8200 steps left; the cloud does 1 step/s (2 h 17 min);
    # spot needs margin + reserve = 1 h on top, so spot is possible until 5.72 h
    deadline_h = 8
    clock = FakeClock()
    launches = Launches(clock, fail_spot=True)  # no spot capacity: each try fails
    s, seen, _ = scheduler(steady(0.5, HOUR), deadline_h, burster=launches, clock=clock,
                           cloud=(1.0, 1.0))
    assert s.run() == "burst"
    last_spot = T0 + timedelta(hours=deadline_h, seconds=-(30 * MINUTE + 30 * MINUTE + 8200))
    spots = [when for when, spot in launches.calls if spot]
    demands = [when for when, spot in launches.calls if not spot]
    assert spots and all(when <= last_spot for when in spots)
    assert len(demands) == 1 and last_spot < demands[0] <= last_spot + s.floor
    outcomes = [f["ok"] for f in bursts_of(seen) if f["state"] != "launching"]
    assert outcomes == [False] * len(spots) + [True]


def test_a_failed_burst_is_retried_at_the_shortest_gap():
    clock = FakeClock()
    launches = Launches(clock, fail_spot=True)
    s, _, _ = scheduler(steady(0.5, HOUR), 30, burster=launches, clock=clock, cloud=(1.0, 1.0))
    s.run()
    times = [when for when, _ in launches.calls]
    assert {b - a for a, b in itertools.pairwise(times)} == {s.floor}


def test_advice_only_records_the_burst_decision_without_launching():
    s, seen, _ = scheduler(steady(0.5, HOUR), 30, burster=None)
    s.run()
    assert bursts_of(seen) == []
    assert any(d["action"] == rules.BURST_SPOT for d in decisions(seen))


def test_a_second_holder_of_a_runs_lock_is_refused_at_once(tmp_path):
    with sched.exclusive(tmp_path / "r.lock"), pytest.raises(sched.Busy), \
            sched.exclusive(tmp_path / "r.lock"):
        pass
    with sched.exclusive(tmp_path / "r.lock"):  # released: free again
        pass


def test_a_burster_that_raises_is_recorded_as_a_failed_burst():
    def broken(run_id, spot):
        raise RuntimeError("no credentials")

    s, seen, _ = scheduler(steady(0.5, HOUR), 3, burster=broken)
    s.clock.moment = at(2 * HOUR)
    s.tick()
    launching, burst = bursts_of(seen)
    assert launching["state"] == "launching"
    assert not burst["ok"] and "no credentials" in burst["error"]


def test_an_installed_tick_runs_only_when_a_backup_is_due():
    s, _, backups = scheduler(steady(0.1, 6 * HOUR), 10, total=None)
    s.clock.moment = at(HOUR)
    assert s.run_once(last_backup=at(HOUR - 10 * MINUTE)) is None
    assert s.run_once(last_backup=at(HOUR - 30 * MINUTE)) is not None
    assert s.run_once(last_backup=None) is not None and len(backups) == 2


def test_an_installed_tick_a_few_seconds_early_still_counts_as_due():
    s, _, _ = scheduler(steady(0.1, 6 * HOUR), 10, total=None)
    s.clock.moment = at(HOUR)
    assert s.run_once(last_backup=at(HOUR - 30 * MINUTE + 5)) is not None


def test_the_history_tells_an_installed_schedule_its_last_backup_and_burst():
    store = fresh_store()
    record = sched.recorder(store, "run")
    record(sched.BACKUP, time=at(60).isoformat(), ok=True)
    record(sched.BURST, time=at(120).isoformat(), ok=True, spot=True)
    past = events.read(store, "run")
    assert sched.last_backup(past) == at(60) and sched.burst_done(past)
    assert all(e["source"] == "schedule" for e in past)


def test_each_decision_event_carries_its_numbers():
    s, seen, _ = scheduler(steady(0.5, 2 * HOUR), 8)
    s.clock.moment = at(HOUR)
    s.tick()
    fields = decisions(seen)[0]
    for key in ("action", "reason", "deadline", "step", "total_steps", "steps_per_second",
                "local_finish", "local_slack_s", "margin_s", "needed_steps_per_second"):
        assert key in fields, key


def test_status_gets_the_newest_backup_decision_and_burst_of_the_schedule():
    clock = FakeClock()
    s, _, _ = scheduler(steady(0.5, HOUR), 30, burster=Launches(clock), clock=clock)
    store = fresh_store()
    s.record = sched.recorder(store, "run")
    s.run()
    state = sched.summary(events.read(store, "run"))
    assert state["decision"]["action"] == rules.BURST_SPOT and state["burst"]["ok"]
    assert state["end"]["reason"] == "burst"
    lines = sched.describe(state)
    assert lines[0].startswith("deadline ") and "burst-spot" in lines[0]
    assert any(line.startswith("scheduled burst on spot") for line in lines)


def test_a_run_never_scheduled_has_no_schedule_status():
    assert sched.summary([{"event": "snapshot", "step": 1}]) is None

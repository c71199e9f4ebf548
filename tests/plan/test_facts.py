"""Run facts from a snapshot and its events: layout, precision, reason, pace, progress."""

from __future__ import annotations

import pytest

from burst.errors import SnapshotError
from burst.plan import facts
from tests.helpers.plan_helpers import manifest


def snap(step: int, time: str) -> dict:
    return {"event": "snapshot", "step": step, "time": time, "reason": "periodic"}


def test_steps_per_second_come_from_the_snapshot_events_of_the_newest_session():
    events = [{"event": "start", "time": "2025-01-01T00:00:00+00:00"},
              snap(10, "2025-01-01T00:00:10+00:00"), snap(30, "2025-01-01T00:00:50+00:00"),
              {"event": "resume", "time": "2025-01-01T01:00:00+00:00"},
              snap(40, "2025-01-01T01:00:10+00:00"), snap(100, "2025-01-01T01:00:40+00:00")]
    assert facts.steps_per_second(events) == pytest.approx(2.0)


def test_the_rate_never_spans_a_restart():
    events = [snap(10, "2025-01-01T00:00:00+00:00"), snap(20, "2025-01-01T00:00:10+00:00"),
              {"event": "resume", "time": "2025-01-01T05:00:00+00:00"},
              snap(30, "2025-01-01T05:00:10+00:00")]
    assert facts.steps_per_second(events) == pytest.approx(1.0)  # the older session's


def test_no_rate_without_two_usable_snapshot_events():
    assert facts.steps_per_second([]) is None
    assert facts.steps_per_second([snap(1, "2025-01-01T00:00:00+00:00"),
                                   {"event": "snapshot", "step": 5, "time": "yesterday"}]) is None


def test_facts_carry_the_snapshots_layout_precision_card_and_reason():
    run = facts.from_snapshot(manifest(global_batch=96, micro=12, world=2, amp="fp16",
                                       card="Tesla T4", reason="oom", step=7))
    assert (run.global_batch, run.micro_batch, run.world_size, run.accumulation) == (96, 12, 2, 4)
    assert (run.amp, run.card, run.failed_oom, run.step) == ("fp16", "Tesla T4", True, 7)


def test_remaining_steps_come_from_the_given_total():
    run = facts.from_snapshot(manifest(step=100), total_steps=250)
    assert run.steps_remaining == 150


@pytest.mark.parametrize("drop_last, steps", [(False, 3 * 16), (True, 3 * 15)])
def test_steps_for_epochs_follow_the_sampler(drop_last, steps):
    data = manifest(global_batch=64, num_samples=1000, drop_last=drop_last)
    assert facts.steps_for_epochs(data, 3) == steps


def test_a_snapshot_without_a_batch_layout_is_an_error():
    data = manifest()
    del data["batch"]
    with pytest.raises(SnapshotError, match="batch layout"):
        facts.from_snapshot(data)

"""What a restore cost, read from the run's history: the loss is the earliest sign of the
end after the run's newest (re)start, and the steps lost are those known completed past
the restored snapshot."""

from __future__ import annotations

from datetime import datetime

from burst.training.membership import last_loss


def at(second: int, event: str, **fields: object) -> dict:
    return {"time": f"2026-01-01T00:00:{second:02d}+00:00", "event": event, **fields}


def test_the_failing_ranks_record_is_the_loss_not_the_agents_later_exit():
    loss = last_loss([at(0, "start", step=0, world_size=2), at(5, "snapshot", step=4),
                      at(7, "failure", kind="oom", step=7, world_size=2),
                      at(9, "child-exit", kind="oom")])
    assert loss.time == datetime.fromisoformat("2026-01-01T00:00:07+00:00")
    assert (loss.cause, loss.reached, loss.world_size) == ("oom", 6, 2)


def test_a_sigkill_is_known_only_from_the_agents_exit():
    loss = last_loss([at(0, "start", step=0), at(4, "snapshot", step=4),
                      at(6, "metrics", points=[{"t": 1.0, "step": 5}]),
                      at(8, "child-exit", kind="killed")])
    assert (loss.time.second, loss.cause, loss.reached) == (8, "killed", 5)


def test_an_end_before_the_newest_restart_was_already_paid_for():
    loss = last_loss([at(0, "start", step=0), at(3, "failure", kind="oom", step=3),
                      at(5, "resume", step=2), at(8, "snapshot", step=6)])
    assert (loss.time, loss.cause, loss.reached) == (None, None, 6)


def test_a_clean_exit_is_no_loss():
    loss = last_loss([at(0, "start", step=0), at(9, "child-exit", kind="ok")])
    assert loss.time is None and loss.cause is None

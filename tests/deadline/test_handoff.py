"""After a scheduled burst: the local training is stopped (or detached) once the node took over.

The local training is a real process holding a real generation of the run; the node is
this test taking the next generation from inside the burster, as `burst resume`'s node does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from burst.deadline import policy as rules
from burst.deadline import scheduler as sched
from burst.deadline.handoff import Handoff
from burst.errors import ConfigError
from burst.snapshot import lineage
from burst.store import LocalStore
from tests.helpers.schedule_helpers import T0, FakeClock, fresh_store, recording, steady, trace

HOUR = 3600.0

LOCAL_TRAINING = textwrap.dedent("""
    import sys, time
    from burst.snapshot import lineage
    from burst.store import LocalStore
    held = lineage.take(LocalStore(sys.argv[1]), "run")
    print(held.generation, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def local_training(tmp_path):
    """A process on this machine holding generation 1 of the run in the store at tmp_path."""
    process = subprocess.Popen([sys.executable, "-c", LOCAL_TRAINING, str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "1"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def burst_and_hand_over(store, mode: str, *, node_takes_over: bool = True, local=None):
    """A stalled run bursts at the first tick; the burster's node takes a generation."""
    clock, history = FakeClock(), fresh_store()
    trace(history, "run", steady(0.5, HOUR))
    seen, record = recording()
    held = []

    def burster(_run_id: str, _spot: bool) -> int:
        if node_takes_over:
            held.append(lineage.take(store, "run"))
        return 0

    policy = rules.Policy(T0 + timedelta(hours=30), rules.Margin(override_s=1800),
                          rules.CloudPace(2.0, 2.0), local_run=mode)
    scheduler = sched.Scheduler(
        "run", policy, clock, lambda: sched.BackupResult(True, step=0),
        sched.observer(history, history, "run", total_steps=10_000), record,
        burster=burster, handoff=Handoff(store, "run", wait=timedelta(minutes=5), local=local))
    clock.moment = T0 + timedelta(hours=2)  # the run has been silent for an hour: stalled
    assert scheduler.tick().burst_ok
    (handoff,) = [fields for name, fields in seen if name == sched.HANDOFF]
    return handoff


def test_stop_sends_the_local_training_sigterm_once_the_node_took_over(tmp_path,
                                                                      local_training):
    handoff = burst_and_hand_over(LocalStore(tmp_path), rules.LOCAL_STOP)
    assert handoff["node_generation"] == 2 and handoff["stopped"] == [local_training.pid]
    assert local_training.wait(timeout=30) == -signal.SIGTERM


def test_stop_finds_a_local_training_that_writes_its_own_local_store(tmp_path, local_training):
    """The schedule uploads for a run that writes a local store: its generation is there."""
    handoff = burst_and_hand_over(LocalStore(tmp_path / "remote"), rules.LOCAL_STOP,
                                  local=LocalStore(tmp_path))
    assert handoff["node_generation"] == 1 and handoff["stopped"] == [local_training.pid]
    assert local_training.wait(timeout=30) == -signal.SIGTERM


def test_detach_leaves_the_local_training_running(tmp_path, local_training):
    handoff = burst_and_hand_over(LocalStore(tmp_path), rules.LOCAL_DETACH)
    assert handoff["detached"] == [local_training.pid] and handoff["stopped"] == []
    assert local_training.poll() is None


def test_a_node_that_never_takes_over_leaves_the_local_training_running(tmp_path,
                                                                       local_training):
    handoff = burst_and_hand_over(LocalStore(tmp_path), rules.LOCAL_STOP,
                                  node_takes_over=False)
    assert handoff["node_generation"] is None and handoff["stopped"] == []
    assert local_training.poll() is None


def test_an_unknown_local_run_policy_is_a_usage_error():
    with pytest.raises(ConfigError, match="stop, detach"):
        rules.Policy(T0, local_run="kill")

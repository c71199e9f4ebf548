"""The deadline schedule runs the preflight before each backup and records what it found:
a burst that would not work is news at the backup, not at the burst."""

from __future__ import annotations

from datetime import timedelta

from burst.deadline import policy as rules
from burst.deadline import scheduler as sched
from burst.preflight.check import for_schedule
from burst.store import open_store
from tests.helpers.plan_helpers import manifest, put_manifest
from tests.helpers.schedule_helpers import T0, FakeClock, recording


def scheduler(preflight, backup=None):
    seen, record = recording()
    policy = rules.Policy(T0 + timedelta(hours=4), rules.Margin(override_s=1800),
                          rules.CloudPace(2.0, 2.0))
    return sched.Scheduler(
        "r", policy, FakeClock(),
        backup or (lambda: sched.BackupResult(True, step=10)),
        lambda now: rules.Progress(10, None, None, now),
        record, preflight=preflight), seen


def test_each_backup_is_preceded_by_a_recorded_preflight(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    put_manifest(open_store(str(local)), manifest("r", step=10))  # never frozen: no lockfile
    s, seen = scheduler(for_schedule(str(remote), str(local), "r", "local"))
    s.tick()
    names = [name for name, _ in seen]
    assert names[:2] == [sched.PREFLIGHT, sched.BACKUP]
    check = seen[0][1]
    assert check["ready"] is False
    assert "environment record" in [p["name"] for p in check["problems"]]
    assert any("a burst would not work" in line for line in sched.describe(
        {"preflight": check}))


def test_a_preflight_that_breaks_is_recorded_and_the_backup_still_runs():
    def broken() -> dict:
        raise RuntimeError("no disk")

    backups = []
    s, seen = scheduler(broken, lambda: backups.append(1) or sched.BackupResult(True, step=1))
    s.tick()
    assert seen[0] == (sched.PREFLIGHT, {"time": seen[0][1]["time"], "ready": None,
                                         "error": "RuntimeError: no disk"})
    assert backups == [1]

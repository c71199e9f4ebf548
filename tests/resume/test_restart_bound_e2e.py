"""End to end through the stub: a managed job whose card keeps failing stops at burst's bound,
and ``burst resume`` exits with the job's meaning.

``burst resume --to local --max-restarts 0`` renders the real task; the stub recovers the
node's 87 as SkyPilot does (not counted against ``max_restarts_on_errors``), with the same
``SKYPILOT_TASK_ID``; the second start finds one restart in the store, over the bound,
trains nothing, records why and exits 89, which the stub does not recover. resume exits 87
(what the job kept dying of), not the stub's 89.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from burst import events
from burst.store import open_store
from tests.helpers.snapshot_helpers import take

pytestmark = pytest.mark.e2e


def test_a_job_that_keeps_failing_stops_at_the_bound_and_resume_says_why(tmp_path):
    ran = tmp_path / "ran"
    url = f"file://{tmp_path / 'store'}"
    take(open_store(url), 4, run_id="sticky",
         batch={"global": 16, "micro": 8, "accumulation": 2, "world_size": 1})
    env = {**os.environ, "BURST_NODE_GPU": "cpu", "BURST_OFFLINE": "1",
           "BURST_CONFIG": os.devnull, "BURST_STUB_SEAL": "off"}
    done = subprocess.run(
        [sys.executable, "-m", "burst.cli", "resume", "sticky", "--to", "local", "--store", url,
         "--local", str(tmp_path / "local"), "--node-python", sys.executable, "--stub-root",
         str(tmp_path / "nodes"), "--gpu", "L4", "--max-restarts", "0", "--",
         "python", "-c", f"import sys; open({str(ran)!r}, 'a').write('x'); sys.exit(87)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 87, done.stderr[-3000:]
    assert "(local said 89)" in done.stderr
    assert done.stderr.count("in recover_on_exit_codes [87, 88]: recovering (not counted)") == 1
    assert ran.read_text() == "x"  # the refused start trained nothing
    history = events.read(open_store(url), "sticky")
    (start,) = [e for e in history if e["event"] == "node-start"]
    (limit,) = [e for e in history if e["event"] == "restart-limit"]
    assert (limit["restarts"], limit["bound"], limit["code"]) == (1, 0, 87)
    assert limit["task_id"] == start["task_id"] and "over the bound of 0" in limit["message"]


# the node's process answers its attempt's fault as burst's training does: 88 after the
# preemption notice (a clean stop), 87 on a sticky GPU failure
ANSWER = ("import os, sys; fault = os.environ.get('BURST_FAULT', ''); open({ran!r}, 'a')"
          ".write('x'); sys.exit(88 if fault.startswith('term') else 87 if "
          "fault.startswith('sticky') else 0)")


def resume_with_faults(tmp_path, run_id: str, faults: list[str], *bounds: str):
    ran = tmp_path / "ran"
    url = f"file://{tmp_path / 'store'}"
    take(open_store(url), 4, run_id=run_id,
         batch={"global": 16, "micro": 8, "accumulation": 2, "world_size": 1})
    env = {**os.environ, "BURST_NODE_GPU": "cpu", "BURST_OFFLINE": "1",
           "BURST_CONFIG": os.devnull, "BURST_STUB_SEAL": "off"}
    stub_faults = [arg for fault in faults for arg in ("--stub-fault", fault)]
    done = subprocess.run(
        [sys.executable, "-m", "burst.cli", "resume", run_id, "--to", "local", "--store", url,
         "--local", str(tmp_path / "local"), "--node-python", sys.executable, "--stub-root",
         str(tmp_path / "nodes"), "--gpu", "L4", *bounds, *stub_faults, "--",
         "python", "-c", ANSWER.format(ran=str(ran))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400, check=False)
    history = events.read(open_store(url), run_id)
    return done, ran.read_text() if ran.exists() else "", history


def test_five_preemptions_and_one_error_end_the_job_only_by_the_error_bound(tmp_path):
    done, ran, history = resume_with_faults(tmp_path, "spot", ["term@1"] * 5 + ["sticky@1"],
                                            "--max-restarts", "0")
    assert done.returncode == 87, done.stderr[-3000:]  # what ended it: the GPU failure
    assert "(local said 89)" in done.stderr
    assert ran == "x" * 6  # five preempted attempts and the failed one trained; not the 7th
    # every clean 88 raced the controller's recheck (the machine still up) and was recovered
    assert done.stderr.count("still up at the controller's 5-second recheck") == 5
    (limit,) = [e for e in history if e["event"] == "restart-limit"]
    assert (limit["errors"], limit["preemptions"]) == (1, 5)
    assert "(--max-restarts)" in limit["message"]
    starts = [e for e in history if e["event"] == "node-start"]
    assert [e["preemptions"] for e in starts] == [0, 1, 2, 3, 4, 5]


def test_a_job_preempted_past_its_bound_stops_there(tmp_path):
    done, ran, history = resume_with_faults(tmp_path, "flaky-spot", ["term@1"] * 5,
                                            "--max-preemptions", "2")
    assert done.returncode == 88, done.stderr[-3000:]
    assert ran == "xxx"
    (limit,) = [e for e in history if e["event"] == "restart-limit"]
    assert limit["preemptions"] == 3 and "(--max-preemptions)" in limit["message"]

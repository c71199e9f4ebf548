"""``scripts/example_train.py``, held once in the middle of a step until SIGTERM arrives.

A test that must act while a run is mid-training (here: start a higher-priority run that
takes its memory) waits for ``$HOLD_FILE`` to appear: the run has then finished
``$HOLD_STEP`` steps and is inside the next one, holding its claim. The SIGTERM the agent
sends lets the step finish; the run then snapshots at the boundary and exits 88 as it
always does. A later attempt (the resumed run) finds the file and is not held again.
"""

import os
import runpy
import signal
import sys
import time
from pathlib import Path

import burst

EXAMPLE = Path(__file__).resolve().parents[2] / "scripts" / "example_train.py"
HOLD = Path(os.environ["HOLD_FILE"])
STEP = int(os.environ.get("HOLD_STEP", "3"))
GIVE_UP_S = 120  # no SIGTERM: the test has failed; do not hang it forever

log = burst.Run.log
stopped = []


def held_log(run, **values):
    log(run, **values)
    if run.step < STEP or HOLD.exists():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def note(signum, frame):
        stopped.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGTERM, note)
    HOLD.touch()
    deadline = time.monotonic() + GIVE_UP_S
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.02)


burst.Run.log = held_log
sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")

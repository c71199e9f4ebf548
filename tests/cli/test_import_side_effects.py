"""Nothing in burst runs at import time: no exit hook, thread or signal handler is set up by
importing a module (each arrives with the first use that needs it), and the kill points
armed from the environment still fire, read at the first point rather than at import.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from burst.env import lockfile
from burst.store import LocalStore

# Imports every module of burst with atexit.register, signal.signal and Thread.start
# recording each call made from burst's own code, then prints what was recorded.
_IMPORT_ALL = """
import atexit, importlib, inspect, pkgutil, signal, threading

seen = []

def recording(what, real):
    def call(*args, **kwargs):
        caller = inspect.currentframe().f_back.f_globals.get("__name__", "")
        if caller.split(".")[0] == "burst":
            seen.append(f"{what} from {caller}")
        return real(*args, **kwargs)
    return call

atexit.register = recording("atexit.register", atexit.register)
signal.signal = recording("signal.signal", signal.signal)
threading.Thread.start = recording("Thread.start", threading.Thread.start)

import burst

names = [info.name for info in pkgutil.walk_packages(burst.__path__, "burst.")
         if not info.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), "modules")
print("\\n".join(seen))
"""


def python(code: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """Run CODE in a fresh interpreter with no BURST_* setting but those given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, timeout=240, check=False, env={**base, **env})


def test_importing_every_module_sets_up_no_exit_hook_thread_or_signal_handler():
    done = python(_IMPORT_ALL)
    assert done.returncode == 0, done.stderr[-3000:]
    count, *calls = done.stdout.strip().splitlines()
    assert int(count.split()[0]) > 50 and calls == []


def test_a_kill_point_armed_in_the_environment_kills_at_that_point(tmp_path):
    log = tmp_path / "points.log"
    done = python("from burst import killpoints\n"
                  "killpoints.hit('first'); print('alive', flush=True)\n"
                  "killpoints.hit('second'); print('not reached')\n",
                  BURST_KILLPOINT="2", BURST_KILLPOINT_LOG=str(log))
    assert done.returncode == -signal.SIGKILL and done.stdout == "alive\n"
    assert log.read_text() == "1 first\n2 second\n"


def test_arming_by_hand_before_the_first_point_wins_over_the_environment():
    done = python("from burst import killpoints\n"
                  "killpoints.arm(None)\n"
                  "killpoints.hit('first'); print('alive')\n",
                  BURST_KILLPOINT="1")
    assert done.returncode == 0 and done.stdout == "alive\n"


def test_a_process_that_exits_right_after_its_run_froze_still_leaves_the_lockfile(tmp_path):
    """The wait for the background upload, now registered by the first upload (not the
    import), still holds the exit until the lockfile has landed in a slow store."""
    done = python("import time\n"
                  "from burst.env import freeze\n"
                  "from burst.store import LocalStore\n"
                  "class Slow(LocalStore):\n"
                  "    def size(self, key):\n"
                  "        time.sleep(1.0)\n"
                  "        return super().size(key)\n"
                  "freeze.freeze_run(Slow('store'), 'r')\n",
                  cwd=tmp_path, BURST_FREEZE="env")
    assert done.returncode == 0, done.stderr[-3000:]
    assert LocalStore(tmp_path / "store").size(lockfile.latest_key("r")) is not None

"""``burst status RUN --watch`` on a real run's store: plain fields without a terminal
(``--once``), and a live view on a terminal (a pty) that redraws until Ctrl-C, exit 0."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.resume.test_resume_e2e import ARGS

pytestmark = pytest.mark.e2e  # it reads the session's reference run, trained once for all
FIELDS = ("where: local: finished", "step: 8", "samples/s: ", "loss: ", "snapshot: step 8",
          "upload backlog: none", "memory: ", "event ")


@pytest.fixture
def store(uninterrupted, tmp_path) -> Path:
    """A copy of the reference run's store (the session's run stays untouched)."""
    return Path(shutil.copytree(uninterrupted(*ARGS).workdir / "store", tmp_path / "store"))


def burst(*args: str) -> list[str]:
    return [sys.executable, "-m", "burst.cli", *args]


def test_once_without_a_terminal_prints_every_field_and_no_control_codes(store):
    done = subprocess.run(burst("status", "reference", "--store", str(store), "--once"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for field in FIELDS:
        assert f"\n  {field}" in done.stdout, field
    assert "samples/s: ?" not in done.stdout and "loss: ?" not in done.stdout
    assert "\x1b" not in done.stdout


def test_the_live_view_redraws_until_ctrl_c_and_exits_0(store):
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160", "LINES": "50"}
    child = subprocess.Popen(burst("status", "reference", "--store", str(store), "--watch",
                                   "--interval", "0.2"),
                             stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 90
    try:
        while seen.count(b"upload backlog") < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                seen += os.read(master, 65536)
        assert seen.count(b"upload backlog") >= 3, seen[-2000:]  # drawn, then redrawn twice
        assert b"\x1b[" in seen  # a terminal: redrawn in place, not appended
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)

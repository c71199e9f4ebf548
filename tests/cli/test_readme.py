"""The README's training loop runs as written, and running it again resumes it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_loop() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    loop = [b for b in blocks if "burst.Run(" in b]
    assert loop, "the README shows no training loop"
    return loop[0]


@pytest.mark.e2e
def test_the_readme_training_loop_runs_and_resumes(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(readme_loop() + "\nprint('step', run.step, 'epoch', run.epoch)\n")
    first = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    assert "step 24 epoch 3" in first.stdout
    assert (tmp_path / ".burst" / "readme-demo" / "snapshots").is_dir()
    second = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert "step 24 epoch 3" in second.stdout  # restored at the end, nothing left to train


def walkthrough() -> str:
    section = README.read_text().split("## Five minutes on a laptop", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.e2e
def test_the_readme_walkthrough_runs_as_written(tmp_path):
    script = tmp_path / "walkthrough.sh"
    script.write_text("set -euo pipefail\n" + walkthrough())
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    env["TMPDIR"] = str(tmp_path)  # mktemp -d lands here, and goes with the test
    done = subprocess.run(["bash", str(script)], cwd=README.parent, capture_output=True,
                          text=True, timeout=480, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert re.search(r"resumed at step [67] ", out)  # the newest persisted snapshot
    assert "fault oom@8: resumed from step 7, 0 step(s) of work lost" in out
    assert "validated with sky.Task.from_yaml_str" in out
    assert "run moved finished" in out
    assert "index.html" in out

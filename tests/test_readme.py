"""The README's training loop runs as written, and running it again resumes it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


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

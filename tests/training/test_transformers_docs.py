"""The Hugging Face Trainer page's complete script runs as written, and a SIGKILLed run of
it, started again with the same command, resumes from burst's snapshot."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from burst import events
from burst.store import LocalStore
from tests.conftest import ROOT

pytest.importorskip("transformers")


def page_script() -> str:
    text = (ROOT / "docs" / "transformers.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]


@pytest.mark.e2e
def test_the_pages_script_resumes_after_a_sigkill(tmp_path):
    (tmp_path / "finetune.py").write_text(page_script())
    # persists every hundredth of a second, so a snapshot exists by step 20 however fast this
    # machine trains (a quiet one runs the 20 steps in half a second; burst's own first
    # persist comes after ten seconds of training)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BURST_FREEZE": "0", "PYTHONHASHSEED": "0",
           "BURST_PERSIST_SECONDS": "0.01"}
    runs = [subprocess.run([sys.executable, "finetune.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, check=False,
                           env={**env, "BURST_FAULT": fault}) for fault in ("kill@20:1", "")]
    assert [r.returncode for r in runs] == [-9, 0], runs[-1].stderr[-3000:]
    history = events.read(LocalStore(tmp_path / ".burst"), "gpt2-finetune")
    resume = next(e for e in history if e["event"] == "resume")
    assert 1 <= resume["step"] < 20
    assert any(e["event"] == "finish" and e["step"] == 32 for e in history)
    assert list((tmp_path / "gpt2-out" / "runs").iterdir())  # report_to=["tensorboard"]

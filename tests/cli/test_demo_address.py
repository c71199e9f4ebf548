"""The address-matching demo end to end: a CUDA OOM injected into a real run, resumed by
the agent (re-planned) and by a resume with the layout kept, against a run that never
stopped; then ``burst report`` on the failed run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_demo_oom_resume_matches_uninterrupted_run(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--quick",
                           "--json", "--workdir", str(tmp_path)], capture_output=True,
                          text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reference, retried, kept = json.loads(done.stdout)["runs"]
    assert retried["failure"] == kept["failure"] == "oom"
    assert retried["resumed_from_step"] == retried["failed_in_step"] - 1  # nothing lost
    assert retried["micro_batch"] == 16 and retried["steps"] == reference["steps"] == 24
    assert kept["identical"] and kept["max_param_diff"] == 0.0  # layout kept: bitwise
    assert retried["max_param_diff"] < 0.1  # re-planned: same samples, other rounding
    assert (tmp_path / "report" / "index.html").is_file()

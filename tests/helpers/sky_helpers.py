"""SkyPilot's own view of a rendered task, from wherever SkyPilot is installed (its own
environment: scripts/setup.sh puts it in .venv-sky; burst.launch.skyenv finds it)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from burst.launch import skyenv


def sky_view(text: str) -> dict[str, Any]:
    """``sky.Task.from_yaml_str(text)`` as plain values: name, num_nodes, setup, run,
    envs, and each resource's accelerators, use_spot, infra, cloud, image_id and
    job_recovery, in order (:func:`burst.launch.skyworker.describe`)."""
    sky = skyenv.find()
    if sky is None:
        pytest.fail(f"SkyPilot is not installed: {skyenv.INSTALL}")
    return skyenv.describe(text, sky)


def sky_infra(infra: str) -> str | None:
    """How SkyPilot writes an ``infra`` value back (``sky.Resources(infra=...).infra``)."""
    view = sky_view(f"resources:\n  infra: {infra}\nrun: 'true'\n")
    return view["resources"][0]["infra"]


def run_in_skypilot(code: str, payload: Any = None) -> Any:
    """Run ``code`` in SkyPilot's interpreter: it reads ``payload`` as JSON from stdin
    (``PAYLOAD``) and assigns its answer to ``RESULT``, printed back as JSON."""
    sky = skyenv.find()
    if sky is None:
        pytest.fail(f"SkyPilot is not installed: {skyenv.INSTALL}")
    script = ("import json, sys\nPAYLOAD = json.loads(sys.stdin.read())\n" + code
              + "\nprint('\\n' + json.dumps(RESULT))\n")
    done = subprocess.run([sky.python or sys.executable, "-c", script], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

"""A machine without ``pivot_root`` cannot seal a stub node: the stub says so as loudly as
for a missing ``unshare`` (a warning, a ``node-unsealed`` event, a dry run that does not
claim a seal), and ``BURST_STUB_SEAL=require`` refuses to run the node at all.

The machine is made for real: a private mount namespace with ``/dev/null`` bound over
every ``pivot_root`` on the stock PATH, and the stub run in it (a real launch, not a
patched lookup)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from burst.launch import sealed
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="hiding pivot_root needs a mount namespace (root)")

PROBE = """\
import json, sys
from pathlib import Path
from burst.launch import Reporter, sealed
from burst.launch.local import LocalLauncher
from burst.launch.task import parse

work = Path(sys.argv[1])
task = parse('''\
name: unsealed-probe
num_nodes: 1
resources:
  ordered:
    - accelerators: "L4:1"
envs:
  BURST_RUN_ID: probe
  BURST_STORE: file://%s
run: |
  echo ran > %s/ran
''' % (work / "store", work))
said, recorded = [], []
report = Reporter(say=said.append, event=lambda name, **f: recorded.append([name, f]),
                  output=lambda _text: None)
auto = LocalLauncher(work / "nodes", seal="auto")
out = {"problem": sealed.problem(), "dry_run": auto.describe(task, [])[0]}
out["code"] = auto.launch(task, {}, report).returncode
out["said"], out["events"] = said, recorded
try:
    LocalLauncher(work / "nodes", seal="require").launch(task, {}, report)
    out["required"] = "launched"
except sealed.SealError as exc:
    out["required"] = str(exc)
print(json.dumps(out))
"""


def without_pivot_root(tmp_path: Path) -> dict:
    hidden = {os.path.realpath(p) for d in sealed.STOCK_PATH.split(":")
              if os.path.exists(p := os.path.join(d, "pivot_root"))}
    assert hidden, "pivot_root must exist here for the test to hide it"
    binds = "".join(f"mount --bind /dev/null {path} && " for path in sorted(hidden))
    (tmp_path / "store").mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'{binds}exec "$0" -c "$1" "$2"', sys.executable, PROBE, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_without_pivot_root_the_stub_warns_records_and_refuses_a_required_seal(tmp_path):
    found = without_pivot_root(tmp_path)
    assert found["problem"] == "pivot_root not found"
    assert "NOT sealed (pivot_root not found)" in found["dry_run"]
    assert found["code"] == 0 and (tmp_path / "ran").exists()  # ran, unsealed, as said
    assert any(line.startswith("WARNING: stub: node NOT sealed (pivot_root not found)")
               for line in found["said"])
    assert found["events"] == [["node-unsealed", {"reason": "pivot_root not found"}]]
    assert "pivot_root not found" in found["required"] and "require" in found["required"]

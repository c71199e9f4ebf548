"""The crash matrix: SIGKILL at every named point of persist, upload and GC, then check.

Two workers (``tests/helpers/crash_harness.py``) split the points between them; each point is a
forked child killed there, and a second child checks that each store lists only
snapshots that verify, that resume restores the newest of them exactly, and that a
restarted uploader and GC recover. A few more kills come from outside at random times.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.store_servers import S3Server, aws_env

SHARDS = 2
TIMED_PER_SHARD = 3


def _run_shards(server: S3Server, work: Path) -> list[dict]:
    procs = []
    for shard in range(SHARDS):
        out = work / f"shard{shard}.json"
        cmd = [sys.executable, "-m", "tests.helpers.crash_harness", "--endpoint", server.endpoint,
               "--ca-bundle", str(server.ca_bundle),
               "--work", str(work / f"w{shard}"), "--out", str(out),
               "--shard", f"{shard}/{SHARDS}", "--timed", str(TIMED_PER_SHARD)]
        procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True), out))
    results = []
    for proc, out in procs:
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, log[-4000:]
        results.append(json.loads(out.read_text()))
    return results


def _summary(points: list[str], outcomes: list[dict]) -> str:
    by_name = collections.Counter(o["at"] for o in outcomes if o["target"])
    lines = [f"crash matrix: {len(points)} named kill points in the workload "
             f"({len(set(points))} distinct), {len(outcomes)} kills "
             f"({sum(1 for o in outcomes if o['target'] is None)} at random times), "
             f"{sum(o['ok'] for o in outcomes)} recovered"]
    lines += [f"  {count:3d} x {name}" for name, count in sorted(by_name.items())]
    resumed = collections.Counter((o.get("resumed_local"), o.get("resumed_remote"))
                                  for o in outcomes)
    lines.append("  resumed (local step, remote step): "
                 + ", ".join(f"{k}: {v}" for k, v in sorted(resumed.items(), key=str)))
    return "\n".join(lines)


@pytest.mark.e2e
def test_sigkill_at_every_point_leaves_only_complete_snapshots(
        seaweed: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    aws_env(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = _run_shards(seaweed, tmp_path)
    points = results[0]["points"]
    outcomes = [o for r in results for o in r["outcomes"]]
    print("\n" + _summary(points, outcomes))
    assert len(points) >= 50
    failed = [o for o in outcomes if not o["ok"]]
    assert not failed, f"{len(failed)} kill points left a broken store: {failed[:3]}"
    named = [o for o in outcomes if o["target"] is not None]
    assert len(named) == len(points) and all(o["killed"] for o in named)
    phases = {name.split(".")[0] for name in points}
    assert {"local", "snapshot", "s3", "push", "gc"} <= phases

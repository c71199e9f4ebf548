"""Manifests that scale: a 4-rank snapshot of 200,000 tensors (800,000 shards) and a
1,024-rank one (262,144 shards), each past the caps an inline manifest had (200,000
shards), commit, list, verify and restore (rank 0's share, and a reshard) with the tensor
table in index files (burst.snapshot.index).

Written at planner level, no training (tests/snapshot/index_scale.py): one process plays
ranks 1..N-1 while another does rank 0's work, whose peak RSS (``VmHWM``) is reported
with the other figures (``-s`` shows them) and held only to a generous bound. Timings
are reported, never asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from burst.snapshot import format as fmt

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]  # minutes on a busy 2-core box

ROOT = Path(__file__).resolve().parents[2]
# name: (ranks, tensors, reshard to, reshard every Nth tensor)
CASES = {"200k-tensors": (4, 200_000, 3, 16), "1024-ranks": (1024, 256, 8, 1)}
PEAK_RSS_BOUND_MIB = 4096  # measured ~1.4 GiB (200k tensors) and ~0.6 GiB (1,024 ranks)


def worker(*args: object) -> list[str]:
    return [sys.executable, "-m", "tests.snapshot.index_scale", *map(str, args)]


@pytest.fixture(scope="module", params=sorted(CASES))
def scaled(request, tmp_path_factory) -> tuple[Path, dict, tuple[int, int, int, int]]:
    """(store root, rank 0's figures, the case) once rank 0 has done all its work."""
    ranks, tensors, reshard_to, every = case = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param) / "store"
    with subprocess.Popen(worker("others", root, ranks, tensors), cwd=ROOT,
                          stderr=subprocess.PIPE, text=True) as others:
        rank0 = subprocess.run(worker("rank0", root, ranks, tensors, reshard_to, every),
                               cwd=ROOT, capture_output=True, text=True, timeout=1500)
        _, others_err = others.communicate(timeout=600)
    assert others.returncode == 0, others_err
    assert rank0.returncode == 0, rank0.stderr
    figures = json.loads(rank0.stdout.strip().splitlines()[-1])
    print(f"\n{request.param}: {json.dumps(figures)}")
    return root, figures, case


def test_the_manifest_counts_index_files_where_shards_are_past_the_old_cap(scaled):
    _, figures, _ = scaled
    assert figures["shards"] > fmt.MAX_MANIFEST_ENTRIES
    assert figures["index_files"] < 100 and figures["manifest_bytes"] < fmt.MAX_MANIFEST_BYTES


def test_rank_0_restores_its_share_and_a_reshard(scaled):
    _, figures, (_, tensors, _, every) = scaled
    assert figures["restore_tensors"] == tensors  # checked bitwise in the worker
    assert figures["reshard_tensors"] == len(range(0, tensors, every))


def test_rank_0_peak_rss_stays_within_a_generous_bound(scaled):
    _, figures, _ = scaled
    assert figures["peak_rss_mib"] < PEAK_RSS_BOUND_MIB, figures


def test_burst_ls_lists_the_snapshot(scaled):
    root, _, _ = scaled
    done = subprocess.run([sys.executable, "-m", "burst.cli", "ls", "run", "--store", str(root),
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert [row["step"] for row in json.loads(done.stdout)] == [7]

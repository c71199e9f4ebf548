"""A run moves between world sizes (1 -> 2, 2 -> 1 under DDP; FSDP2 2 -> 2 and 2 -> 1) and
stays the same run as one that never stopped on one process.

Every case trains ``scripts/example_distributed.py`` (MLP, AdamW, StepLR, per-sample noise
through SeededDataset, global batch 8, 40 samples, 3 epochs = 15 steps) in real processes
(``python -m torch.distributed.run --standalone``, gloo on CPU). The first leg is killed
with SIGKILL at step 8 (rank 0, before its first micro-batch), after the newest snapshot
is stored (step 6, or 7 when the persister coalesced step 6's write into the newer RAM
copy); the second leg restores at another world size and finishes.

Checked against the uninterrupted single-process reference:

- every optimizer step consumes exactly the reference's samples, in its order (the ranks'
  contiguous chunks concatenated), and its global batch is 8 throughout;
- the step's loss (the ranks' shares averaged) and the final parameters and optimizer
  state are *bitwise* equal when each rank runs one micro-batch of 4 per step: the
  reference's ``0.5*g0 + 0.5*g1`` accumulation and DDP's / FSDP's ``(g0 + g1) / 2``
  reduction differ only by exact power-of-two scalings and one commutative addition.
  With two micro-batches per rank (``no_sync`` accumulation) the sums associate
  differently, ``(a0+a1)+(a2+a3)`` against ``((a0+a1)+a2)+a3``, so only float tolerance;
- rank 0's random stream continues the reference's exactly across every change; a rank
  restored at its own world size continues its own stream; a rank the snapshot lacked
  draws from ``torch.manual_seed(rank_seed(seed, step, rank))``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from burst.snapshot import reader
from burst.snapshot.tensors import load_tensors
from burst.state import rank_rng
from burst.store import open_store

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "scripts" / "example_distributed.py"
STEPS, KILL_AT = 15, "8:0"
TIMEOUT = 150


def launch(workdir: Path, ranks: int, run_id: str, *args: str, store: str = "store",
           records: str | None = None) -> subprocess.CompletedProcess:
    """One process, or ``ranks`` processes under torchrun; records in <records>.rank<R>."""
    head = [sys.executable]
    if ranks > 1:
        head += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd = [*head, str(EXAMPLE), "--run-id", run_id, "--store", str(workdir / store),
           "--records", str(workdir / (records or run_id)), *args]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "BURST_FREEZE": "0",
           "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:  # every process dumps its stack, then all go
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            out, err = proc.communicate()
            pytest.fail(f"{cmd} hung for {TIMEOUT}s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """Child processes, recursively (torchrun's workers may sit in their own groups)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def steps(workdir: Path, run_id: str) -> list[dict]:
    """Per optimizer step, as all its ranks saw it (the latest attempt of a replayed step)."""
    ranks: list[dict[int, dict]] = []
    for rank in range(4):
        path = workdir / f"{run_id}.rank{rank}"
        latest: dict[int, dict] = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            record = json.loads(line)
            latest[record["step"]] = record
        ranks.append(latest)
    merged = []
    for step in sorted(ranks[0]):
        parts = [ranks[r][step] for r in range(ranks[0][step]["world"])]
        merged.append({
            "step": step, "world": len(parts), "samples": parts[0]["samples"],
            "indices": [i for p in parts for i in p["indices"]],
            "loss": sum(float.fromhex(p["loss"]) for p in parts) / len(parts),
            "draws": [float.fromhex(p["draw"]) for p in parts],
        })
    return merged


def final_state(workdir: Path, run_id: str, store: str = "store") -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the run's last snapshot (the same layout at any
    world size, which is what lets these runs be compared at all)."""
    opened = open_store(workdir / store)
    manifest = reader.read_manifest(opened, run_id)
    assert manifest is not None and manifest["step"] == STEPS
    tensors = load_tensors(opened, manifest)
    return {k: v for k, v in tensors.items() if k.startswith(("state/model", "state/optimizer"))}


def draws_from(seed: int, count: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(1, generator=generator).item() for _ in range(count)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    done = launch(workdir, 1, "ref")
    assert done.returncode == 0, done.stderr
    return steps(workdir, "ref"), final_state(workdir, "ref")


def kill_then_resume(workdir: Path, first: tuple[int, list[str]], then: tuple[int, list[str]]
                     ) -> tuple[subprocess.CompletedProcess, int]:
    """The resumed leg's result and the step it resumed from."""
    (ranks, args), (ranks_after, args_after) = first, then
    assert_killed(launch(workdir, ranks, "run", *args, "--kill-at", KILL_AT))
    resumed = launch(workdir, ranks_after, "run", *args_after)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return resumed, resumed_from(resumed)


def resumed_from(done: subprocess.CompletedProcess) -> int:
    found = re.search(r"rank 0: resumed at step (\d+)", done.stdout)
    assert found and int(found[1]) in (6, 7), done.stdout
    return int(found[1])


def assert_killed(killed: subprocess.CompletedProcess) -> None:
    """Rank 0 died of its own SIGKILL (torchrun then stops the other ranks)."""
    assert killed.returncode == -signal.SIGKILL or (
        killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stderr), (
        killed.returncode, killed.stdout, killed.stderr)


def assert_same_samples(actual: list[dict], expected: list[dict], worlds: dict[int, int]) -> None:
    assert [s["step"] for s in actual] == list(range(1, STEPS + 1))
    assert [s["indices"] for s in actual] == [s["indices"] for s in expected]
    assert {s["samples"] for s in actual} == {8}
    assert {s["step"]: s["world"] for s in actual} == {
        step: next(w for last, w in sorted(worlds.items()) if step <= last)
        for step in range(1, STEPS + 1)}


def assert_bitwise(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def test_one_rank_to_two_ddp_is_bitwise_the_uninterrupted_run(tmp_path, reference):
    expected, expected_state = reference
    resumed, at = kill_then_resume(tmp_path, (1, []), (2, ["--parallel", "ddp"]))
    assert "world size 1 -> 2" in resumed.stdout
    assert "rank 1's random generators re-created" in resumed.stdout
    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {at: 1, STEPS: 2})
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    assert_bitwise(final_state(tmp_path, "run"), expected_state)
    assert [s["draws"][0] for s in actual] == [s["draws"][0] for s in expected]
    rank1 = draws_from(rank_rng.rank_seed(0, at, 1), STEPS - at)
    assert [s["draws"][1] for s in actual[at:]] == rank1


def test_two_ranks_to_one_with_accumulation_matches_within_tolerance(tmp_path, reference):
    """Two ranks at micro-batch 2 (two micro-batches each, DDP reducing once per step
    through ``no_sync``), then one process at micro-batch 4: not bitwise (see above)."""
    expected, expected_state = reference
    resumed, at = kill_then_resume(tmp_path, (2, ["--parallel", "ddp", "--micro-batch", "2"]),
                                   (1, []))
    assert "world size 2 -> 1" in resumed.stdout
    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {at: 2, STEPS: 1})
    assert [s["loss"] for s in actual] == pytest.approx([s["loss"] for s in expected], rel=1e-5)
    state = final_state(tmp_path, "run")
    assert state.keys() == expected_state.keys()
    for name, tensor in expected_state.items():
        torch.testing.assert_close(state[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    assert [s["draws"][0] for s in actual] == [s["draws"][0] for s in expected]
    assert [s["draws"][1] for s in actual[:at]] == draws_from(1001, at)


def test_fsdp_snapshot_from_two_ranks_restores_at_two_and_at_one(tmp_path, reference):
    """FSDP2 (``fully_shard``) shards parameters and optimizer state; the snapshot holds
    them gathered to full tensors, so both restores are bitwise the reference."""
    expected, expected_state = reference
    killed = launch(tmp_path, 2, "run", "--parallel", "fsdp", "--kill-at", KILL_AT)
    assert_killed(killed)
    shutil.copytree(tmp_path / "store", tmp_path / "store-one")
    for rank in range(2):
        shutil.copy(tmp_path / f"run.rank{rank}", tmp_path / f"one.rank{rank}")
    manifest = reader.read_manifest(open_store(tmp_path / "store"), "run")
    at = manifest["step"]
    assert at in (6, 7) and manifest["batch"]["world_size"] == 2
    assert len(manifest["state"]["rng_ranks"]) == 2

    again = launch(tmp_path, 2, "run", "--parallel", "fsdp")
    assert again.returncode == 0, again.stdout + again.stderr
    assert resumed_from(again) == at
    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {STEPS: 2})
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    assert_bitwise(final_state(tmp_path, "run"), expected_state)
    assert [s["draws"][0] for s in actual] == [s["draws"][0] for s in expected]
    assert [s["draws"][1] for s in actual] == draws_from(1001, STEPS)  # restored, not re-made

    one = launch(tmp_path, 1, "run", store="store-one", records="one")  # a plain model
    assert one.returncode == 0, one.stdout + one.stderr
    assert "world size 2 -> 1" in one.stdout
    actual = steps(tmp_path, "one")
    assert_same_samples(actual, expected, {at: 2, STEPS: 1})
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    assert_bitwise(final_state(tmp_path, "run", "store-one"), expected_state)

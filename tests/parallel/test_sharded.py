"""Sharded snapshots (format v2): every rank writes its own shards, any world size reads
back the parts it needs, and the run stays the run that never stopped.

Every case trains ``scripts/example_distributed.py`` (MLP, AdamW, StepLR, per-sample
noise, global batch 12, 48 samples, 2 epochs = 8 steps, one micro-batch per rank) in real
processes (``torch.distributed.run``, gloo on CPU), launched with the scale-out tests'
helpers. On several ranks a persist due at step 3 lands at step 4 (the ranks agree one
boundary late), so the snapshots are steps 4, 7 and the final 8.

One 4-rank FSDP2 first leg serves every restore: rank 2 is SIGKILLed inside its write of
step 7's snapshot, at its first ``shard.blob`` kill point (counted in the uninterrupted
reference run, which logs the points that rank reaches). Step 4 stays the newest complete
snapshot; copies of that store restore at 4 ranks (bitwise the reference, the README's
same-world-size rule), and at 2, 3 and 1 (float tolerance: the gradient reduction adds in
another order). Whatever the world size, every step consumes exactly the reference's
samples, and each rank that exists on both sides continues its own random stream.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from burst.snapshot import reader
from burst.snapshot.tensors import load_tensors
from burst.state import rank_rng
from burst.store import open_store
from tests.parallel.test_scale_out import assert_killed, draws_from, launch, steps

pytestmark = pytest.mark.e2e

STEPS = 8  # 48 samples / 12 per step x 2 epochs
DATA = ("--samples", "48", "--global-batch", "12", "--epochs", "2")
KILL_RANK, KILL_STEP = 2, 7  # armed in step 7's body: it dies writing step 7's snapshot
PREVIOUS = 4  # the snapshot before it
STAGING = 16 << 20  # the persister's bounded staging (packing small tensors, hashing)
SHARDED_FORMAT = 4  # burst.snapshot.format.SHARDED_FORMAT_VERSION (format 2 before BLAKE3)


def layout(ranks: int, parallel: str = "fsdp") -> list[str]:
    """One micro-batch per rank (12 samples per step at any world size)."""
    return [*DATA, "--parallel", parallel if ranks > 1 else "none",
            "--micro-batch", str(12 // ranks)]


def kill_args(point: int, log: Path) -> list[str]:
    return ["--kill-rank", str(KILL_RANK), "--kill-step", str(KILL_STEP),
            "--kill-point", str(point), "--killpoint-log", str(log)]


def points(log: Path) -> list[str]:
    """Kill point names in the order the rank reached them (``N name`` lines)."""
    path = Path(f"{log}.rank{KILL_RANK}")
    return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []


def final_state(store: Path, run_id: str = "run") -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the run's last snapshot (whole tensors, whatever
    the world size that wrote them)."""
    opened = open_store(store)
    manifest = reader.read_manifest(opened, run_id)
    assert manifest is not None and manifest["step"] == STEPS
    tensors = load_tensors(opened, manifest)
    return {k: v for k, v in tensors.items() if k.startswith(("state/model", "state/optimizer"))}


def resumed_at(done: subprocess.CompletedProcess) -> int:
    found = re.search(r"rank 0: resumed at step (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return int(found[1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 4-rank FSDP2 run, and the kill points rank 2 reaches from step 7's
    snapshot on (logged only)."""
    workdir = tmp_path_factory.mktemp("sharded-reference")
    log = workdir / "points"
    done = launch(workdir, 4, "ref", *layout(4), *kill_args(0, log))
    assert done.returncode == 0, done.stdout + done.stderr
    return steps(workdir, "ref"), final_state(workdir / "store", "ref"), points(log)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, reference):
    """The 4-rank FSDP2 first leg, rank 2 SIGKILLed after landing its first blob of step
    7's snapshot: (workdir, the leg's result, the points rank 2 reached)."""
    reached = reference[2]
    assert "shard.blob" in reached, f"rank {KILL_RANK}'s snapshot writes reached {reached}"
    workdir = tmp_path_factory.mktemp("sharded-killed")
    log = workdir / "points"
    done = launch(workdir, 4, "run", *layout(4),
                  *kill_args(reached.index("shard.blob") + 1, log))
    return workdir, done, points(log)


def restore_copy(killed_leg: tuple, workdir: Path, ranks: int, parallel: str = "fsdp"
                 ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Resume a copy of the killed leg's store (and its records) at ``ranks``."""
    source, _, _ = killed_leg
    shutil.copytree(source / "store", workdir / "store")
    for rank in range(4):
        shutil.copy(source / f"run.rank{rank}", workdir / f"run.rank{rank}")
    done = launch(workdir, ranks, "run", *layout(ranks, parallel))
    assert done.returncode == 0, done.stdout + done.stderr
    return done, steps(workdir, "run")


def assert_same_samples(actual: list[dict], expected: list[dict], worlds: dict[int, int]
                        ) -> None:
    """Every step consumed the reference's samples in its order, 12 of them, at the world
    size ``worlds`` gives (last step of a leg -> its world size)."""
    assert [s["step"] for s in actual] == list(range(1, STEPS + 1))
    assert [s["indices"] for s in actual] == [s["indices"] for s in expected]
    assert {s["samples"] for s in actual} == {12}
    assert {s["step"]: s["world"] for s in actual} == {
        step: next(w for last, w in sorted(worlds.items()) if step <= last)
        for step in range(1, STEPS + 1)}


def assert_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def assert_streams(actual: list[dict], expected: list[dict], fresh: dict[int, int]) -> None:
    """Each rank's draws continue the reference's stream of the same rank, except a rank
    re-created at step ``fresh[rank]``, which draws from the seed the rules derive."""
    for rank in range(4):
        drawn = [s["draws"][rank] for s in actual if rank < s["world"]]
        if rank in fresh:
            at = fresh[rank]
            assert drawn == draws_from(rank_rng.rank_seed(0, at, rank), STEPS - at), rank
        else:
            assert drawn == [s["draws"][rank] for s in expected][:len(drawn)], rank


def test_sigkill_of_one_rank_mid_snapshot_leaves_the_previous_one_newest(killed):
    workdir, done, reached = killed
    assert_killed(done)
    assert reached and reached[-1] == "shard.blob", reached  # died after landing a blob
    store = open_store(workdir / "store")
    assert reader.list_steps(store, "run") == [PREVIOUS]
    manifest = reader.read_manifest(store, "run")
    assert manifest["format"] == SHARDED_FORMAT and manifest["batch"]["world_size"] == 4


def test_fsdp_four_ranks_restore_at_four_bitwise(tmp_path, reference, killed):
    expected, expected_state, _ = reference
    done, actual = restore_copy(killed, tmp_path, 4)
    assert resumed_at(done) == PREVIOUS
    assert_same_samples(actual, expected, {STEPS: 4})
    assert [s["loss"] for s in actual] == [s["loss"] for s in expected]
    final = final_state(tmp_path / "store")
    assert final.keys() == expected_state.keys()
    for name, tensor in expected_state.items():
        assert torch.equal(final[name], tensor), name
    assert [s["draws"] for s in actual] == [s["draws"] for s in expected]


@pytest.mark.parametrize("ranks", [2, 3, 1])
def test_fsdp_four_ranks_restore_at_another_world_size(tmp_path, reference, killed, ranks):
    expected, expected_state, _ = reference
    done, actual = restore_copy(killed, tmp_path, ranks)
    assert resumed_at(done) == PREVIOUS
    assert f"world size 4 -> {ranks}" in done.stdout
    assert_same_samples(actual, expected, {PREVIOUS: 4, STEPS: ranks})
    assert [s["loss"] for s in actual] == pytest.approx([s["loss"] for s in expected], rel=1e-5)
    assert_close(final_state(tmp_path / "store"), expected_state)
    assert_streams(actual, expected, fresh={})


def test_ddp_two_ranks_restore_as_fsdp_four(tmp_path, reference):
    expected, expected_state, _ = reference
    assert_killed(launch(tmp_path, 2, "run", *layout(2, "ddp"), "--kill-at", "6:0"))
    done = launch(tmp_path, 4, "run", *layout(4))
    assert done.returncode == 0, done.stdout + done.stderr
    assert resumed_at(done) == PREVIOUS and "world size 2 -> 4" in done.stdout
    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {PREVIOUS: 2, STEPS: 4})
    assert [s["loss"] for s in actual] == pytest.approx([s["loss"] for s in expected], rel=1e-5)
    assert_close(final_state(tmp_path / "store"), expected_state)
    assert_streams(actual, expected, fresh={2: PREVIOUS, 3: PREVIOUS})


def test_v1_snapshot_of_one_process_restores_at_fsdp_two(tmp_path, reference):
    expected, expected_state, _ = reference
    assert_killed(launch(tmp_path, 1, "run", *layout(1), "--kill-at", "5:0"))
    manifest = reader.read_manifest(open_store(tmp_path / "store"), "run")
    assert manifest["format"] == 3 and manifest["step"] == 3  # one process: whole (v1's layout)
    done = launch(tmp_path, 2, "run", *layout(2))
    assert done.returncode == 0, done.stdout + done.stderr
    assert resumed_at(done) == 3 and "world size 1 -> 2" in done.stdout
    actual = steps(tmp_path, "run")
    assert_same_samples(actual, expected, {3: 1, STEPS: 2})
    assert [s["loss"] for s in actual] == pytest.approx([s["loss"] for s in expected], rel=1e-5)
    assert_close(final_state(tmp_path / "store"), expected_state)
    assert_streams(actual, expected, fresh={1: 3})


def test_rank0_peak_memory_in_a_four_rank_snapshot_is_a_quarter_of_the_state(tmp_path):
    """A ~64 MB state (6 hidden layers of 1024): rank 0's peak RSS growth across each
    snapshot stays within its quarter of the state plus the staging buffer (gathering
    the whole state to rank 0, as format v1 did, grows it by the full state)."""
    report = tmp_path / "memory.jsonl"
    done = launch(tmp_path, 4, "mem", "--samples", "36", "--global-batch", "12",
                  "--epochs", "1", "--parallel", "fsdp", "--micro-batch", "3",
                  "--persist-every", "1", "--hidden", "1024", "--layers", "6",
                  "--memory-report", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["final"] for line in lines][:2] == [False, False]  # steps 2 and 3, final
    for line in lines:
        assert line["world"] == 4 and line["state_bytes"] > 60e6
        assert line["growth"] <= line["state_bytes"] / 4 + STAGING, line

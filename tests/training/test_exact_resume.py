"""A run killed with SIGKILL and restarted ends bit-identical to one that never stopped.

Each case trains ``scripts/example_train.py`` (MLP with BatchNorm and dropout, AdamW,
StepLR, per-sample noise through SeededDataset, gradient accumulation 2) three times in
fresh processes: uninterrupted; killed at a (step, micro-batch); restarted with the same
command. Parameters, buffers, optimizer, scheduler, scaler, the torch RNG, every step's
loss bits and every step's sample indices must be identical.
"""

from __future__ import annotations

import signal

import pytest

from tests.conftest import assert_same, final_state, run_example, step_records

pytestmark = pytest.mark.e2e

CASES = {
    # name: (extra args, kill at "step:micro", step the restore must resume from)
    "mid_epoch_mid_window": (["--scaler"], "8:1", 6),
    "two_workers": (["--workers", "2"], "8:1", 6),
    "epoch_boundary": (["--persist-every", "7"], "8:0", 7),
    "drop_last": (["--drop-last", "--persist-every", "4"], "10:1", 8),
    "no_shuffle_loader_drop_last": (["--no-shuffle", "--loader-drop-last", "--micro-batch", "6",
                                     "--global-batch", "12"], "10:1", 9),
}


@pytest.mark.parametrize("case", CASES)
def test_killed_and_restarted_run_matches_uninterrupted_run(tmp_path, case, uninterrupted):
    extra, kill_at, resume_step = CASES[case]
    reference = uninterrupted(*extra)

    killed = run_example(tmp_path, "crashy", *extra, "--kill-at", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_example(tmp_path, "crashy", *extra)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at step {resume_step}" in resumed.stdout

    expected, actual = reference.records, step_records(tmp_path / "crashy.jsonl")
    assert [r["indices"] for r in actual] == [r["indices"] for r in expected]
    assert [r["loss"] for r in actual] == [r["loss"] for r in expected]
    assert_same(final_state(tmp_path, "crashy"), reference.final)


def test_every_sample_is_consumed_once_per_epoch_across_a_crash(tmp_path):
    run_example(tmp_path, "crashy", "--kill-at", "5:1")
    run_example(tmp_path, "crashy")
    records = step_records(tmp_path / "crashy.jsonl")
    for epoch in range(3):
        seen = [i for r in records if r["epoch"] == epoch for i in r["indices"]]
        assert sorted(seen) == list(range(100))

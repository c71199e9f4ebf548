"""Loops without a DataLoader, killed and restarted: nanoGPT's and word_language_model's.

``scripts/example_nanogpt.py`` draws ``torch.randint`` offsets into a memory-mapped token
file, with dropout and two micro-batches a step, through ``run.batches`` (the next batch
drawn ahead, as nanoGPT does); ``scripts/example_lstm.py`` slices a token stream by bptt
offsets (``run.batches(..., over=...)``) and carries the LSTM's hidden state and the best
validation loss from step to step (``attach(carry=...)``). Each is SIGKILLed before its
first persist, mid accumulation, during a persist, in its last step, and twice in a row
(``tests/loop_harness.py``, one forked process per run); every re-run must end with the
same loss bits at every step and the same final weights as the run that never stopped.
nanoGPT's loop as written (a batch drawn before the loop and after each forward pass,
outside what a snapshot holds) must be warned about, and is indeed not exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.store import LocalStore
from burst.training.batches import OUTSIDE_EVENT
from tests.conftest import ROOT, assert_same, final_state, step_records

pytestmark = pytest.mark.e2e

SCRIPTS = ("nanogpt", "lstm")
# the steps each restart resumed from: persists every 3 steps, each kill's own snapshots
RESUMED = {
    "before_first_persist": {"nanogpt": [], "lstm": []},
    "mid_accumulation": {"nanogpt": [3], "lstm": [3]},
    "during_persist": {"nanogpt": [3], "lstm": [3]},  # the second persist never completed
    "near_end": {"nanogpt": [9], "lstm": [15]},
    "twice_in_a_row": {"nanogpt": [3, 9], "lstm": [3, 9]},
}
WARNING = "random numbers were drawn after attach()"


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Both scripts' scenarios, run by two harness processes side by side."""
    work = tmp_path_factory.mktemp("own-loops")
    procs = {}
    for script in SCRIPTS:
        cmd = [sys.executable, "-m", "tests.loop_harness", "--script", script,
               "--work", str(work / script), "--out", str(work / f"{script}.json")]
        procs[script] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    results = {}
    for script, proc in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, log[-4000:]
        results[script] = (work / script, json.loads((work / f"{script}.json").read_text()))
    return results


def resumed_steps(folder: Path, run_id: str) -> list[int]:
    history = events.read(LocalStore(folder / "store"), run_id)
    return [e["step"] for e in history if e["event"] == "resume"]


@pytest.mark.parametrize("scenario", sorted(RESUMED))
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_loop_killed_and_restarted_ends_bitwise_equal_to_the_uninterrupted_run(
        harness, script, scenario):
    work, results = harness[script]
    exits = {name: result["exits"] for name, result in results.items()}
    assert exits["reference"] == [0]
    assert exits[scenario][:-1] == [-9] * (len(exits[scenario]) - 1)  # SIGKILLed
    assert exits[scenario][-1] == 0
    assert resumed_steps(work / scenario, scenario) == RESUMED[scenario][script]
    expected = step_records(work / "reference" / "records.jsonl")
    assert step_records(work / scenario / "records.jsonl") == expected
    assert_same(final_state(work / scenario, "final"), final_state(work / "reference", "final"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_persist_killed_mid_write_leaves_no_temporary_once_the_run_restarts(harness, script):
    _, results = harness[script]
    killed, restarted = results["during_persist"]["temporaries"]
    assert killed  # the kill came between a blob's write and its rename
    assert restarted == []


def test_a_batch_drawn_outside_the_steps_is_warned_about_once(harness):
    work, results = harness["nanogpt"]
    assert results["old_way"]["exits"] == [0]
    assert (work / "old_way" / "run0.err").read_text().count(WARNING) == 1
    history = events.read(LocalStore(work / "old_way" / "store"), "old_way")
    assert [e["step"] for e in history if e["event"] == OUTSIDE_EVENT] == [0]


def test_batches_drawn_by_run_batches_raise_no_warning(harness):
    for script in SCRIPTS:
        work, _ = harness[script]
        assert "random numbers were drawn" not in (work / "reference" / "run0.err").read_text()


def test_the_old_way_is_not_the_same_run_once_resumed(harness):
    """Why the warning matters: the batch drawn before the loop is drawn anew on resume."""
    work, results = harness["nanogpt"]
    assert results["old_way_resumed"]["exits"] == [-9, 0]
    uninterrupted = step_records(work / "old_way" / "records.jsonl")
    resumed = step_records(work / "old_way_resumed" / "records.jsonl")
    assert resumed[:3] == uninterrupted[:3]  # before the kill's snapshot: the same
    assert all(a != b for a, b in zip(resumed[3:], uninterrupted[3:], strict=True))

"""Loops without a DataLoader, killed and restarted: nanoGPT's and word_language_model's.

``scripts/example_nanogpt.py`` draws ``torch.randint`` offsets into a memory-mapped token
file, with dropout and two micro-batches a step, through ``run.batches`` (the next batch
drawn ahead, as nanoGPT does); ``scripts/example_lstm.py`` slices a token stream by bptt
offsets (``run.batches(..., over=...)``) and carries the LSTM's hidden state and the best
validation loss from step to step (``attach(carry=...)``). Each is SIGKILLed before its
first persist, mid accumulation, during a persist, in its last step, and twice in a row
(``tests/helpers/loop_harness.py``, one forked process per run); every re-run must end with the
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
FIRST_PERSIST = 3  # persist_every: the first snapshot is of step 3 (or, coalesced, later)
# the steps each kill came in (None: in the persister, mid-write): each restart must resume
# from a snapshot taken before its kill; which one depends on how far the background
# persister got (a newer shadow replaces a persist still queued)
KILLED_IN = {
    "before_first_persist": {"nanogpt": [2], "lstm": [2]},
    "mid_accumulation": {"nanogpt": [5], "lstm": [5]},
    "during_persist": {"nanogpt": [None], "lstm": [None]},
    "near_end": {"nanogpt": [12], "lstm": [16]},
    "twice_in_a_row": {"nanogpt": [5, 10], "lstm": [5, 10]},
}
WARNING = "random numbers were drawn after attach()"


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Both scripts' scenarios, run by two harness processes side by side."""
    work = tmp_path_factory.mktemp("own-loops")
    procs = {}
    for script in SCRIPTS:
        cmd = [sys.executable, "-m", "tests.helpers.loop_harness", "--script", script,
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


@pytest.mark.parametrize("scenario", sorted(KILLED_IN))
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_loop_killed_and_restarted_ends_bitwise_equal_to_the_uninterrupted_run(
        harness, script, scenario):
    work, results = harness[script]
    exits = {name: result["exits"] for name, result in results.items()}
    assert exits["reference"] == [0]
    assert exits[scenario][:-1] == [-9] * (len(exits[scenario]) - 1)  # SIGKILLed
    assert exits[scenario][-1] == 0
    resumed, killed = resumed_steps(work / scenario, scenario), KILLED_IN[scenario][script]
    if scenario == "before_first_persist":
        assert resumed == []  # nothing to resume from: the restart began afresh
    else:
        assert len(resumed) == len(killed) and resumed == sorted(set(resumed))
        assert all(FIRST_PERSIST <= step < (kill or step + 1)
                   for step, kill in zip(resumed, killed, strict=True))
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
    (start,) = resumed_steps(work / "old_way_resumed", "old_way_resumed")
    assert resumed[:start] == uninterrupted[:start]  # up to the snapshot: the same
    assert all(a != b for a, b in zip(resumed[start:], uninterrupted[start:], strict=True))

"""A run's history as each rank records it (burst.training.history)."""

from __future__ import annotations

from burst import events
from burst.store.local import LocalStore
from burst.training.history import History


def test_rank_zero_tells_the_story_of_the_run(tmp_path):
    store = LocalStore(tmp_path)
    History(store, "r", rank=0, writer=True)("start", step=0)
    assert [(e["event"], e.get("rank")) for e in events.read(store, "r")] == [("start", None)]


def test_another_rank_leaves_the_story_to_rank_zero_and_marks_its_failures(tmp_path):
    store = LocalStore(tmp_path)
    record = History(store, "r", rank=3, writer=False)
    for name in ("start", "resume", "finish"):
        record(name, step=1)
    record("failure", step=2)
    assert [(e["event"], e["rank"]) for e in events.read(store, "r")] == [("failure", 3)]

"""A run's history is merged, never overwritten, when it moves between machines."""

from __future__ import annotations

import json

import pytest

from burst import events
from burst.store import MemoryStore


def write(store, lines: list[dict]) -> None:
    store.put(events.key("r"), "".join(json.dumps(e) + "\n" for e in lines).encode())


def test_merging_keeps_both_sides_events_in_time_order(tmp_path):
    laptop, bucket = MemoryStore("laptop-merge"), MemoryStore("bucket-merge")
    write(laptop, [{"time": "T1", "event": "start"}, {"time": "T3", "event": "failure"}])
    write(bucket, [{"time": "T1", "event": "start"}, {"time": "T2", "event": "snapshot"},
                   {"time": "T4", "event": "node-start"}])
    assert events.merge(laptop, bucket, "r") is True
    assert [e["event"] for e in events.read(bucket, "r")] == [
        "start", "snapshot", "failure", "node-start"]
    assert events.merge(laptop, bucket, "r") is False  # nothing new: nothing written


def test_events_of_the_same_millisecond_keep_their_written_order():
    here, there = MemoryStore("here-merge"), MemoryStore("there-merge")
    write(here, [{"time": "T1", "event": "schedule-backup"},
                 {"time": "T1", "event": "schedule-decision"}])
    events.merge(here, there, "r")
    assert [e["event"] for e in events.read(there, "r")] == ["schedule-backup",
                                                             "schedule-decision"]


BAD_LINES = ('{"a":' * 50000 + "\n" + "not json\n" + "[1, 2]\n").encode()


def test_lines_that_are_not_events_are_skipped_with_one_warning_counting_them():
    store = MemoryStore("bad-lines")
    store.put(events.key("r"), b'{"time": "T1", "event": "start"}\n' + BAD_LINES
              + b'{"time": "T2", "event": "resume"}\n')
    with pytest.warns(RuntimeWarning, match="skipped 3 line") as caught:
        history = events.read(store, "r")
    assert [e["event"] for e in history] == ["start", "resume"]
    assert len(caught) == 1


def test_merging_leaves_lines_that_are_not_events_behind():
    here, there = MemoryStore("here-bad"), MemoryStore("there-bad")
    here.put(events.key("r"), b'{"time": "T1", "event": "start"}\n' + BAD_LINES)
    with pytest.warns(RuntimeWarning, match="skipped 3 line"):
        assert events.merge(here, there, "r") is True
    assert there.get(events.key("r")) == b'{"time": "T1", "event": "start"}\n'

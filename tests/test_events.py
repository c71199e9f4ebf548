"""A run's history is merged, never overwritten, when it moves between machines."""

from __future__ import annotations

import json

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

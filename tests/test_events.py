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
    write(laptop, [{"time": "2026-01-01T00:00:01.000+00:00", "event": "start"}, {"time": "2026-01-01T00:00:03.000+00:00", "event": "failure"}])
    write(bucket, [{"time": "2026-01-01T00:00:01.000+00:00", "event": "start"}, {"time": "2026-01-01T00:00:02.000+00:00", "event": "snapshot"},
                   {"time": "2026-01-01T00:00:04.000+00:00", "event": "node-start"}])
    assert events.merge(laptop, bucket, "r") is True
    assert [e["event"] for e in events.read(bucket, "r")] == [
        "start", "snapshot", "failure", "node-start"]
    assert events.merge(laptop, bucket, "r") is False  # nothing new: nothing written


def test_events_of_the_same_millisecond_keep_their_written_order():
    here, there = MemoryStore("here-merge"), MemoryStore("there-merge")
    write(here, [{"time": "2026-01-01T00:00:01.000+00:00", "event": "schedule-backup"},
                 {"time": "2026-01-01T00:00:01.000+00:00", "event": "schedule-decision"}])
    events.merge(here, there, "r")
    assert [e["event"] for e in events.read(there, "r")] == ["schedule-backup",
                                                             "schedule-decision"]


BAD_LINES = ('{"a":' * 50000 + "\n" + "not json\n" + "[1, 2]\n").encode()


def test_lines_that_are_not_events_are_skipped_with_one_warning_counting_them():
    store = MemoryStore("bad-lines")
    store.put(events.key("r"), b'{"time": "2026-01-01T00:00:01.000+00:00", "event": "start"}\n' + BAD_LINES
              + b'{"time": "2026-01-01T00:00:02.000+00:00", "event": "resume"}\n')
    with pytest.warns(RuntimeWarning, match="skipped 3 line") as caught:
        history = events.read(store, "r")
    assert [e["event"] for e in history] == ["start", "resume"]
    assert len(caught) == 1


def test_merging_leaves_lines_that_are_not_events_behind():
    here, there = MemoryStore("here-bad"), MemoryStore("there-bad")
    here.put(events.key("r"), b'{"time": "2026-01-01T00:00:01.000+00:00", "event": "start"}\n' + BAD_LINES)
    with pytest.warns(RuntimeWarning, match="skipped 3 line"):
        assert events.merge(here, there, "r") is True
    [own] = there.list(events.history_prefix("r"))
    assert there.get(own) == b'{"time": "2026-01-01T00:00:01.000+00:00", "event": "start"}\n'


def test_an_object_store_is_never_read_modify_written_in_a_shared_object():
    bucket = MemoryStore("no-shared-rmw")
    write(bucket, [{"time": "2020-01-01T00:00:00.000+00:00", "event": "start"}])
    before = bucket.get(events.key("r"))
    events.append(bucket, "r", "launch", to="local")
    assert bucket.get(events.key("r")) == before
    [own] = bucket.list(events.history_prefix("r"))
    assert own == events.writer_key("r", events.process_writer())
    assert [e["event"] for e in events.read(bucket, "r")] == ["start", "launch"]


def test_a_local_store_keeps_appending_to_its_one_file(tmp_path):
    from burst.store import open_store

    local, there = open_store(str(tmp_path / "local")), MemoryStore("from-there")
    events.append(local, "r", "start")
    write(there, [{"time": "2020-01-01T00:00:00.000+00:00", "event": "freeze"}])
    assert events.merge(there, local, "r") is True
    assert local.list(events.history_prefix("r")) == []
    assert [e["event"] for e in events.read(local, "r")] == ["freeze", "start"]


def test_a_line_in_two_history_objects_is_read_once():
    bucket = MemoryStore("read-once")
    line = b'{"time": "2026-01-01T00:00:01.000+00:00", "event": "node-exit", "returncode": 87}\n'
    bucket.put(events.writer_key("r", "a"), line)
    bucket.put(events.writer_key("r", "b"), line + b'{"time": "2026-01-01T00:00:02.000+00:00", "event": "x"}\n')
    assert [e["event"] for e in events.read(bucket, "r")] == ["node-exit", "x"]
    assert events.exists(bucket, "r") and not events.exists(bucket, "other")


NODE = """\
import sys, time
from burst import events
from burst.snapshot import sync
from burst.store import open_store
local, url, rank, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
tier = open_store(local)
events.append(tier, "two", "node-exit", returncode=87 + rank, node_rank=rank)
store = open_store(url, endpoint_url=sys.argv[5], addressing_style="path", region="us-east-1")
time.sleep(max(0.0, start - time.time()))
sync.copy_extras(tier, store, "two")
"""


@pytest.mark.e2e
def test_two_nodes_finishing_at_once_both_leave_their_exit_records(tmp_path, moto_s3,
                                                                    monkeypatch):
    """Two node processes publish their history at the same moment through a store far
    away (every read of the history answered a second late): a shared object written by
    read-modify-write would keep only the last writer's ``node-exit``."""
    import os
    import subprocess
    import sys
    import time

    from burst.store import open_store
    from tests.helpers.fault_proxy import FaultProxy, start
    from tests.helpers.store_servers import ACCESS_KEY, SECRET_KEY

    proxy = FaultProxy(moto_s3.endpoint, moto_s3.ca_bundle)
    proxy.add("latency", "GET", r"events\.jsonl|/history/", times=None)
    server, endpoint = start(proxy)
    url = moto_s3.url("two-nodes")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    try:
        at = time.time() + 8  # both processes imported and ready by then
        nodes = [subprocess.Popen([sys.executable, "-c", NODE, str(tmp_path / f"node{r}"), url,
                                   str(r), str(at), endpoint], env=env) for r in (0, 1)]
        assert [p.wait(timeout=120) for p in nodes] == [0, 0]
    finally:
        server.shutdown()
        server.server_close()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = open_store(url, **moto_s3.options(region="us-east-1"))
    exits = [e for e in events.read(store, "two") if e["event"] == "node-exit"]
    assert sorted(e["returncode"] for e in exits) == [87, 88]

"""``live_view``: a run on a node, seen from the store its node uploads to: where it runs,
its step, pace and loss from the node's metric points, and its GPU memory."""

from __future__ import annotations

from burst import events
from burst.resume.live import live_view
from burst.store import open_store


def test_a_node_run_is_read_from_the_stores_events(tmp_path):
    store = open_store(str(tmp_path / "store"))
    clock = iter(f"2026-01-01T00:00:0{n}.000+00:00" for n in range(10))

    def record(name: str, **fields: object) -> None:
        events.append(store, "r", name, time=next(clock), **fields)  # one event a second

    record("start")
    record("metrics", points=[{"step": 1, "samples": 10, "t": 5.0, "loss": 9.0}])  # not pace
    record("node-start", host="n1", node_dir="/nodes/1", step=40)
    record("resume", step=40)
    record("gpu-sample", gpus=[{"memory_used": 3 << 30, "memory_total": 80 << 30},
                               {"memory_used": 1 << 30, "memory_total": 80 << 30}])
    record("metrics", points=[
        {"step": 41, "samples": 400, "t": 100.0, "loss": 0.5},
        {"step": 42, "samples": 600, "t": 110.0, "loss": 0.25}])
    view = live_view(store, "r")
    assert view["where"]["place"] == "node n1 (/nodes/1)"
    assert view["step"] == 42 and view["loss"] == 0.25
    assert view["samples_per_second"] == 20.0
    assert view["memory"]["used_bytes"] == 4 << 30 and view["memory"]["gpus"] == 2
    assert view["snapshot"] is None and view["upload_backlog"] == []
    assert [e["event"] for e in view["events"]][-1] == "metrics"

"""What a node fetches before training: a whole snapshot is pulled into its local tier; a
sharded one is left in the store when the node starts several ranks (each reads its own
byte ranges), and pulled when one process will need all of it; the pull's bytes and
seconds are recorded, the store's speed as a node sees it."""

from __future__ import annotations

import threading

import torch

from burst import events
from burst.resume.node import PULL_EVENT, fetch_snapshot
from burst.snapshot import reader
from burst.snapshot.parts import Box, commit_parts, write_part
from burst.store import open_store

RUN = "run"
TREE = {"model": {"w": {"$tensor": "state/model/w"}}}


def sharded_snapshot(store, step: int = 3) -> None:
    """Two ranks (threads) write a row each of one tensor; rank 0 commits."""
    w = torch.arange(8.0).reshape(2, 4)

    def part(rank: int) -> None:
        write_part(store, RUN, step, rank, {"state/model/w": w[rank:rank + 1].clone()},
                   {"state/model/w": Box((2, 4), (rank, 0))}, world_size=2)

    other = threading.Thread(target=part, args=(1,))
    other.start()
    part(0)
    other.join()
    commit_parts(store, RUN, step, 2, tree=TREE, meta={"reason": "periodic"}, timeout=30)


def fetch(tmp_path, gpus: str):
    store, local = open_store(str(tmp_path / "store")), open_store(str(tmp_path / "local"))
    sharded_snapshot(store)
    said: list[str] = []
    step, planned_from = fetch_snapshot(store, local, RUN, said.append,
                                        {"SKYPILOT_NUM_GPUS_PER_NODE": gpus})
    return store, local, step, planned_from, said


def test_a_node_of_several_ranks_leaves_a_sharded_snapshot_in_the_store(tmp_path):
    store, local, step, planned_from, said = fetch(tmp_path, "2")
    assert step == 3 and planned_from is store
    assert reader.list_steps(local, RUN) == []
    assert "each of the 2 ranks reads its own shards" in said[0]


def test_a_node_of_one_process_pulls_a_sharded_snapshot_whole(tmp_path):
    _, local, step, planned_from, _ = fetch(tmp_path, "1")
    assert step == 3 and planned_from is local
    assert reader.verify(local, RUN, 3)["step"] == 3


def test_a_node_records_how_many_bytes_its_pull_took_and_how_long(tmp_path):
    _, local, _, _, _ = fetch(tmp_path, "1")
    pull = next(e for e in events.read(local, RUN) if e["event"] == PULL_EVENT)
    assert pull["step"] == 3 and pull["bytes"] > 0 and pull["seconds"] >= 0

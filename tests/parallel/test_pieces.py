"""Each rank's pieces of a sharded snapshot (burst.parallel.pieces), in real gloo processes:
FSDP2 and DDP at world size 2 on CPU, AdamW stepped once."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from burst.parallel.pieces import capture_rank, owners
from burst.snapshot import tree as tree_mod
from burst.state import capture as state_mod
from tests.helpers.store_servers import free_port

WORLD = 2


def build() -> tuple[torch.nn.Module, torch.Tensor]:
    """The same small model and batch in every process (a last layer of one row leaves
    rank 1 an empty FSDP shard)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.LayerNorm(6),
                                torch.nn.Linear(6, 3), torch.nn.Linear(3, 1))
    model.register_buffer("seen", torch.arange(5, dtype=torch.float64))
    return model, torch.randn(4, 8)


def step(model: torch.nn.Module, batch: torch.Tensor) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(batch).sum().backward()
    optimizer.step()
    return optimizer


def worker(rank: int, port: int, out: str) -> None:
    """One rank: for FSDP2 and for DDP, wrap, step once and capture its pieces; write them
    as JSON for the test (one process group for both: starting ranks is the slow part)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for kind in ("fsdp", "ddp"):
            state_tree, tensors, boxes = capture_wrapped(kind, rank)
            pieces = {name: {"shape": list(boxes[name].shape),
                             "offsets": list(boxes[name].offsets), "sizes": list(t.shape),
                             "values": t.detach().double().reshape(-1).tolist()}
                      for name, t in tensors.items()}
            Path(out, f"{kind}{rank}.json").write_text(json.dumps({"tree": state_tree,
                                                                   "pieces": pieces}))
    finally:
        dist.destroy_process_group()


def capture_wrapped(kind: str, rank: int) -> tuple[dict, dict, dict]:
    from burst.parallel.group import Group, unwrap

    model, batch = build()
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    optimizer = step(wrapped, batch)
    components = state_mod.Components(unwrap(wrapped), optimizer)
    return capture_rank(components, {"note": "x"}, Group(rank, WORLD))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pieces")
    mp.start_processes(worker, args=(free_port(), str(out)), nprocs=WORLD, join=True,
                       start_method="spawn")
    return out


def read(out: Path, kind: str) -> list[dict]:
    return [json.loads((out / f"{kind}{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def fsdp(ranks) -> list[dict]:
    return read(ranks, "fsdp")


@pytest.fixture(scope="module")
def ddp(ranks) -> list[dict]:
    return read(ranks, "ddp")


def whole_capture() -> tuple[dict, dict[str, torch.Tensor]]:
    """What one plain process captures after the same step (a whole, v1 snapshot)."""
    model, batch = build()
    optimizer = step(model, batch)
    state_tree, tensors = state_mod.capture(state_mod.Components(model, optimizer),
                                            {"note": "x"})
    return state_tree, {name: t.detach().clone() for name, t in tensors.items()}


def assembled(ranks: list[dict]) -> dict[str, torch.Tensor]:
    """Every tensor put together from the ranks' pieces; each element written exactly once."""
    out: dict[str, torch.Tensor] = {}
    written: dict[str, torch.Tensor] = {}
    for rank in ranks:
        for name, piece in rank["pieces"].items():
            if name not in out:
                out[name] = torch.zeros(piece["shape"], dtype=torch.float64)
                written[name] = torch.zeros(piece["shape"], dtype=torch.int64)
            box = tuple(slice(o, o + n) for o, n in zip(piece["offsets"], piece["sizes"],
                                                        strict=True))
            out[name][box] = torch.tensor(piece["values"], dtype=torch.float64).reshape(
                piece["sizes"])
            written[name][box] += 1
    for name, count in written.items():
        assert bool((count == 1).all()), f"{name} is not covered exactly once"
    return out


def test_fsdp_ranks_pieces_cover_every_tensor_exactly_once_with_the_trained_values(fsdp):
    _, whole = whole_capture()
    pieces = assembled(fsdp)
    shared = {n for n in whole if n.startswith(("state/model/", "state/optimizer/"))}
    assert shared <= pieces.keys()
    for name in shared:
        assert torch.allclose(pieces[name], whole[name].double(), atol=1e-6), name


def test_fsdp_ranks_write_their_own_shards_not_the_whole_tensor(fsdp):
    weight = [rank["pieces"]["state/model/0.weight"] for rank in fsdp]
    assert [(p["offsets"], p["sizes"]) for p in weight] == [([0, 0], [3, 8]), ([3, 0], [3, 8])]
    assert "state/model/3.weight" not in fsdp[1]["pieces"]  # its shard of one row is empty


def test_fsdp_tree_is_the_same_on_every_rank_and_a_whole_snapshots(fsdp):
    whole_tree, _ = whole_capture()
    for part in ("model", "optimizer"):
        assert fsdp[0]["tree"][part] == fsdp[1]["tree"][part] == whole_tree[part]
    names = set(tree_mod.tensor_names(fsdp[0]["tree"]))
    assert names == set(tree_mod.tensor_names(whole_tree)) | {
        n for n in names if n.startswith("state/rng_ranks/")}
    assert fsdp[0]["tree"]["extra"] == {"note": "x"} and "extra" not in fsdp[1]["tree"]


def test_ddp_replicated_tensors_are_written_once_by_the_balanced_owner(ddp):
    pieces = assembled(ddp)
    shared = [n for n in pieces if n.startswith(("state/model/", "state/optimizer/"))]
    by_rank = {n: r for r, rank in enumerate(ddp) for n in rank["pieces"] if n in shared}
    sizes = {n: math.prod(pieces[n].shape) * element_size(n) for n in shared}
    assert by_rank == owners(sizes, WORLD)
    assert set(by_rank.values()) == {0, 1}
    assert ddp[0]["tree"]["model"] == ddp[1]["tree"]["model"]
    assert ddp[0]["tree"]["optimizer"] == ddp[1]["tree"]["optimizer"]


def element_size(name: str) -> int:
    """Bytes per element of the model's tensors: float32, the float64 buffer, the
    optimizer's float32 steps."""
    return 8 if name == "state/model/seen" else 4


def test_rank_0_alone_writes_the_generators_and_extra(ddp):
    assert any(n.startswith("state/rng_ranks/") for n in ddp[0]["pieces"])
    assert not any(n.startswith(("state/rng", "state/scheduler")) for n in ddp[1]["pieces"])


def test_owners_balances_bytes_largest_first_ties_to_the_lowest_rank():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 40, "e": 10, "f": 10}
    assert owners(sizes, 2) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1, "f": 1}
    assert owners(dict(reversed(sizes.items())), 2) == owners(sizes, 2)  # order-free
    assert owners({"x": 5, "y": 5, "z": 5}, 4) == {"x": 0, "y": 1, "z": 2}

"""Restoring a snapshot into FSDP2 at a world size other than the one that saved it:
each rank reads only its own box of every sharded tensor (burst.parallel.reshard) and
the state gathered back from the shards is bitwise the saved one.

Real processes (torch.multiprocessing, gloo on CPU). Two snapshots of one trained
single-process model: the format 1 snapshot that process writes, and a format 2 one of
the same state cut into 4 row blocks per tensor, one blob per block's "rank", as a
4-rank save lays it out. One spawn of 3 ranks restores every case into a freshly
initialised model (the 2-rank cases on a subgroup) and writes what it found; the tests
read that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from burst.errors import SnapshotError
from burst.parallel import sharded as dcp
from burst.parallel import state as dist_state
from burst.parallel.group import Group
from burst.snapshot import format as fmt
from burst.snapshot import reader, shards
from burst.snapshot.tensors import load_tensors, tensor_bytes
from burst.snapshot.tiers import Captured, write_snapshot
from burst.state import capture as state_mod
from burst.store.local import LocalStore

RUN = "run"
V1_STEP, V2_STEP = 3, 4
WIDTH = 5  # rows of the first layer: uneven at 2 and 3 ranks
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")


def make_model(seed: int, width: int = WIDTH) -> nn.Module:
    """Rows 5 and 2 split unevenly over 2 and 3 ranks (the last layer's bias leaves a
    rank empty at 3); the batch norm brings buffers and an int64 counter."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width), nn.ReLU(),
                         nn.Linear(width, 2))


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(V1_STEP):
        loss = model(torch.randn(16, 8, generator=generator)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def write_v2(store: LocalStore, v1: dict, tensors: dict[str, torch.Tensor], parts: int) -> None:
    """The same state as format 2: every tensor of one dimension or more cut into
    ``parts`` row blocks, block r of every tensor packed in "rank" r's blob; scalars
    whole, in rank 0's blob."""
    blobs: list[bytearray] = [bytearray() for _ in range(parts)]
    placed: dict[str, list[tuple[int, list[int], list[int], int, int]]] = {}
    for name, tensor in tensors.items():
        blocks = torch.tensor_split(tensor, parts) if tensor.dim() else [tensor]
        start = 0
        for rank, block in enumerate(blocks):
            offsets = [start] + [0] * (tensor.dim() - 1)
            start += block.shape[0] if tensor.dim() else 0
            if block.numel() == 0:
                continue
            data = tensor_bytes(block.contiguous())
            blob = blobs[rank]
            blob.extend(b"\0" * (-len(blob) % fmt.ALIGN))
            placed.setdefault(name, []).append((rank, offsets, list(block.shape), len(blob),
                                                len(data)))
            blob.extend(data)
    algo = fmt.hash_of(v1)
    digests = [fmt.digest(blob, algo) for blob in blobs]
    entries = {}
    for name, boxes in placed.items():
        entry = {"dtype": v1["tensors"][name]["dtype"], "shape": v1["tensors"][name]["shape"]}
        pieces = [{"offsets": o, "sizes": s, "blob": digests[r], "offset": off, "nbytes": n}
                  for r, o, s, off, n in boxes]
        if tensors[name].dim() == 0:
            entries[name] = {**entry, "blob": pieces[0]["blob"], "offset": pieces[0]["offset"],
                             "nbytes": pieces[0]["nbytes"]}
        else:
            entries[name] = {**entry, "shards": pieces}
    for digest, blob in zip(digests, blobs, strict=True):
        store.put(fmt.blob_key(RUN, digest), bytes(blob))
    manifest = {**v1, **fmt.format_fields(sharded=True, algo=algo), "step": V2_STEP,
                "tensors": entries,
                "blobs": {d: fmt.blob_info(b, algo) for d, b in zip(digests, blobs, strict=True)}}
    store.put(fmt.manifest_key(RUN, V2_STEP), fmt.encode_manifest(manifest))


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> Path:
    """A store holding the trained model's format 1 snapshot and its format 2 twin."""
    root = tmp_path_factory.mktemp("reshard")
    store = LocalStore(root / "store")
    model, optimizer = trained()
    tree, live = state_mod.capture(state_mod.Components(model, optimizer), {"note": "saved"})
    copies = {name: t.detach().clone() for name, t in live.items()}
    v1 = write_snapshot(store, RUN, Captured(V1_STEP, tree, copies, {}))
    write_v2(store, v1, copies, parts=4)
    return root


# (case, ranks it runs on): all in one spawn of 3 processes, the 2-rank cases on a
# subgroup of ranks 0 and 1 (one start of the processes, not one per world size)
CASES = [("v1", 3), ("v2", 3), ("v1", 2), ("mismatch", 2)]


@pytest.fixture(scope="module")
def restored(snapshots) -> dict[str, dict]:
    """What each case found, by "<case>-at-<ranks>"."""
    mp.spawn(worker, args=(str(snapshots),), nprocs=3, join=True)
    return {f"{case}-at-{n}": json.loads((snapshots / f"{case}-at-{n}.json").read_text())
            for case, n in CASES}


# -- the ranks -------------------------------------------------------------------------


def worker(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank,
                            world_size=3)
    try:
        pair = dist.new_group([0, 1])  # every rank takes part in making it
        meshes = {3: DeviceMesh("cpu", [0, 1, 2])}
        if rank < 2:
            meshes[2] = DeviceMesh.from_group(pair, "cpu")
        for case, ranks in CASES:
            if rank < ranks:
                group = Group(rank, ranks)
                result = RANK_CASES[case](Path(root), group, meshes[ranks])
                if rank == 0:
                    (Path(root) / f"{case}-at-{ranks}.json").write_text(json.dumps(result))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def sharded_live(mesh: Any, width: int = WIDTH) -> state_mod.Components:
    """A fresh FSDP2 model on ``mesh`` (other weights than the saved ones), its AdamW."""
    from torch.distributed.fsdp import fully_shard

    model = make_model(7, width)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[3], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return state_mod.Components(model, torch.optim.AdamW(model.parameters(), lr=0.5))


def restore(root: Path, step: int, group: Group, components: state_mod.Components) -> list[str]:
    store = LocalStore(root / "store")
    manifest = reader.read_manifest(store, RUN, step)
    saved = dist_state.load(store, manifest, components, group)
    return dist_state.restore(components, saved, group, saved_amp=None, amp=None, seed=0,
                              step=step, saved_world_size=1)


def gathered_differences(root: Path, components: state_mod.Components) -> list[str]:
    """Where the live state, gathered to rank 0, differs from the format 1 snapshot as
    read by the ordinary whole-tensor path (empty on other ranks)."""
    model_state, optim_state = dcp.full_state(components.model, components.optimizer)
    if model_state is None:
        return []
    store = LocalStore(root / "store")
    manifest = reader.read_manifest(store, RUN, V1_STEP)
    expected = state_mod.decode(manifest, load_tensors(store, manifest))
    return differences({"model": model_state, "optimizer": optim_state},
                       {"model": expected["model"], "optimizer": expected["optimizer"]})


def differences(actual: object, expected: object, path: str = "") -> list[str]:
    if isinstance(expected, torch.Tensor):
        same = (isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype
                and actual.shape == expected.shape and torch.equal(actual, expected))
        return [] if same else [path]
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            return [path]
        return [d for k in expected for d in differences(actual[k], expected[k], f"{path}/{k}")]
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return [path]
        return [d for i, (a, e) in enumerate(zip(actual, expected, strict=True))
                for d in differences(a, e, f"{path}/{i}")]
    return [] if actual == expected else [path]


def case_v1(root: Path, group: Group, mesh: Any) -> dict:
    components = sharded_live(mesh)
    restore(root, V1_STEP, group, components)
    return {"differences": gathered_differences(root, components)}


def case_v2(root: Path, group: Group, mesh: Any) -> dict:
    components = sharded_live(mesh)
    restore(root, V2_STEP, group, components)
    return {"differences": gathered_differences(root, components)}


def case_mismatch(root: Path, group: Group, mesh: Any) -> dict:
    """A model one row wider than the snapshot's: refused, and nothing changed."""
    components = sharded_live(mesh, WIDTH + 1)
    loss = components.model(torch.randn(4, 8)).sum()
    loss.backward()
    components.optimizer.step()  # optimizer state to keep
    before = local_state(components)
    try:
        restore(root, V1_STEP, group, components)
        error = None
    except SnapshotError as exc:
        error = str(exc)
    return {"error": error, "changed": differences(local_state(components), before)}


def local_state(components: state_mod.Components) -> dict:
    """Copies of this rank's own shards of the model and optimizer state."""
    def local(value: object) -> object:
        if isinstance(value, torch.Tensor):
            value = value.to_local() if hasattr(value, "to_local") else value
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        return value

    return local({"model": components.model.state_dict(),
                  "optimizer": components.optimizer.state_dict()})


RANK_CASES = {"v1": case_v1, "v2": case_v2, "mismatch": case_mismatch}


# -- the tests -------------------------------------------------------------------------


def test_format_1_snapshot_restores_into_fsdp_at_two_ranks_bitwise(restored):
    assert restored["v1-at-2"]["differences"] == []


def test_format_1_snapshot_restores_into_fsdp_at_three_ranks_bitwise(restored):
    assert restored["v1-at-3"]["differences"] == []


def test_four_rank_row_blocks_restore_into_fsdp_at_three_ranks_bitwise(restored):
    assert restored["v2-at-3"]["differences"] == []


def test_a_shape_mismatch_is_refused_before_anything_changes(restored):
    found = restored["mismatch-at-2"]
    assert "'0.weight' is (5, 8) in the snapshot, (6, 8) in the model" in found["error"]
    assert found["changed"] == []


def test_the_format_2_twin_holds_the_format_1_state(snapshots):
    """The hand-made format 2 snapshot is sharded and reads back as the format 1 one."""
    store = LocalStore(snapshots / "store")
    v1 = reader.read_manifest(store, RUN, V1_STEP)
    v2 = reader.read_manifest(store, RUN, V2_STEP)
    assert sum("shards" in entry for entry in v2["tensors"].values()) > 10
    whole = load_tensors(store, v1)
    assert differences({n: shards.read_whole(store, v2, n) for n in v2["tensors"]}, whole) == []


def test_four_rank_row_blocks_restore_into_one_plain_process(snapshots):
    """No process group: every tensor whole, applied by the ordinary restore."""
    store = LocalStore(snapshots / "store")
    manifest = reader.read_manifest(store, RUN, V2_STEP)
    components = state_mod.Components(make_model(7), None)
    components.optimizer = torch.optim.AdamW(components.model.parameters(), lr=0.5)
    saved = dist_state.load(store, manifest, components, Group())
    dist_state.restore(components, saved, Group(), saved_amp=None, amp=None, seed=0,
                       step=V2_STEP, saved_world_size=4)
    model, optimizer = trained()
    assert differences({"model": components.model.state_dict(),
                        "optimizer": components.optimizer.state_dict()},
                       {"model": model.state_dict(), "optimizer": optimizer.state_dict()}) == []

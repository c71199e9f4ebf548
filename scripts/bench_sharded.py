"""Sharded snapshots against the alternatives, side by side in one run (issue 20).

Four CPU ranks (``torch.multiprocessing``, gloo) train an FSDP2 MLP (``--layers`` linear
layers of ``--hidden`` x ``--hidden``; the defaults make about 300 MB of model and AdamW
state) and snapshot the same state, step after step, three ways:

- (a) burst: a ``burst.Run`` with a store; blocked = ``run.snapshot()`` (the copy the
  loop waits for), total = until rank 0 sees the step's manifest in the store (committed:
  the snapshot is complete and durable). ``run.flush()`` returns later, once rank 0 also
  pruned the oldest snapshot (``keep=2``), which ``dcp.save`` never does; the table
  gives that time too.
  With sharded snapshots (format v2) every rank writes its own shards; before them the
  same call takes the gather path of (b). The table says which format it wrote.
- (b) today's gather to rank 0: ``burst.parallel.sharded.full_state`` on every rank, a
  copy into host buffers on rank 0 (what the RAM shadow does), then rank 0 alone writes a
  v1 snapshot (``burst.snapshot.tiers.write_snapshot``);
- (c) ``torch.distributed.checkpoint.save`` into a directory (``FileSystemWriter``
  defaults, files fsynced); blocked = total: the call returns once it is written.

Then two ranks load the newest of each (resharding 4 -> 2): burst through ``Run.attach``
from (a)'s store, burst's whole-tensor restore of (b)'s v1 snapshot (every rank reads
every blob, then keeps its shard), and ``dcp.load``; the three loaded models must agree.

The first round is a warm-up (buffers allocated, files created) and is not counted; each
later round runs one optimizer step first, so the state changes and burst's
content-addressed store cannot skip the write. Times are medians over the rounds.
On a machine with fewer cores than ranks the ranks share cores: compare ratios, not
absolute seconds.

    .venv/bin/python scripts/bench_sharded.py [--hidden 2048 --layers 6 --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

METHODS = {"a": "burst Run (a)", "b": "gather to rank 0, v1 (b)", "c": "dcp.save (c)"}
GLOBAL_BATCH = 4  # the run's global batch (a snapshot keeps it): micro = 4 / world size
LOADS = {"a": "burst Run.attach (a)", "b": "burst v1 whole tensors (b)", "c": "dcp.load (c)"}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--load-ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2, help="measured rounds (after a warm-up)")
    p.add_argument("--dir", default="", help="where the stores go (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    return p.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world: int, port: int) -> None:
    os.environ.setdefault("BURST_FREEZE", "0")  # no environment freeze: not what is measured
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def build(hidden: int, layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, hidden: int) -> None:
    x = torch.randn(2, hidden, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)  # DTensor: global numel


class BurstRun:
    """(a): the real thing, a Run with a store (the snapshot is ``run.snapshot()``)."""

    def __init__(self, root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                 ) -> None:
        import burst

        self.run = burst.Run("bench-a", store=str(root / "a"), global_batch=GLOBAL_BATCH,
                             micro_batch=GLOBAL_BATCH // dist.get_world_size(),
                             shadow_every=1 << 30, persist_seconds=None, keep=2)
        self.run.attach(model, optimizer)
        self.root = root
        self.flushed: list[float] = []  # until run.flush() returned, each round

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, hidden: int) -> None:
        self.run.begin_step()
        train_step(model, optimizer, hidden)
        self.run.end_step(self.run.global_batch)

    def save(self) -> tuple[float, float]:
        from burst.snapshot import format as fmt

        manifest = self.root / "a" / fmt.manifest_key("bench-a", self.run.step)
        started = time.perf_counter()
        self.run.snapshot("manual")
        blocked = time.perf_counter() - started
        while dist.get_rank() == 0 and not manifest.exists():  # committed
            time.sleep(0.002)
        committed = time.perf_counter() - started
        self.run.flush()  # rank 0: the retention (pruning) done too
        self.flushed.append(time.perf_counter() - started)
        return blocked, committed

    def format(self) -> int | None:
        from burst.snapshot import reader

        manifest = reader.read_manifest(self.run.store, "bench-a")
        return None if manifest is None else manifest["format"]


class Gather:
    """(b): every rank gathers the full state to rank 0, which copies it into host buffers
    and writes a v1 snapshot alone (the path before sharded snapshots)."""

    def __init__(self, root: Path) -> None:
        from burst.snapshot.tiers import ShadowBuffers
        from burst.store import open_store

        self.store = open_store(str(root / "b"))
        self.buffers = ShadowBuffers()
        self.count = 0

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[float, float]:
        from burst.parallel.sharded import full_state
        from burst.snapshot import tree
        from burst.snapshot.tiers import Captured, write_snapshot

        self.count += 1
        started = time.perf_counter()
        full_model, full_optim = full_state(model, optimizer)
        if dist.get_rank() != 0:
            return time.perf_counter() - started, 0.0
        tensors: dict[str, torch.Tensor] = {}
        state = {"model": tree.encode(full_model, "state/model", tensors),
                 "optimizer": tree.encode(full_optim, "state/optimizer", tensors)}
        copies = self.buffers.copy_from(tensors)
        blocked = time.perf_counter() - started
        meta = {"reason": "manual", "batch": {"world_size": dist.get_world_size()}}
        write_snapshot(self.store, "bench-b", Captured(self.count, state, copies, meta))
        return blocked, time.perf_counter() - started


def dcp_save(root: Path, count: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[float, float]:
    """(c): DCP's own save, synchronous (returns once every rank's files and the metadata
    are written)."""
    started = time.perf_counter()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state},
             checkpoint_id=str(root / "c" / f"{count:04d}"))
    elapsed = time.perf_counter() - started
    return elapsed, elapsed


def save_worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    join(rank, world, port)
    root = Path(args["root"])
    model, optimizer = build(args["hidden"], args["layers"])
    burst_run = BurstRun(root, model, optimizer)
    gather = Gather(root)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in METHODS}
    for round_ in range(args["rounds"] + 1):  # round 0: warm-up
        burst_run.step(model, optimizer, args["hidden"])  # the same state for a, b and c
        for key in METHODS:
            dist.barrier()
            if key == "a":
                taken = burst_run.save()
            elif key == "b":
                taken = gather.save(model, optimizer)
            else:
                taken = dcp_save(root, round_, model, optimizer)
            dist.barrier()
            if round_:
                times[key].append(taken)
    result = {"rank": rank, "times": times, "flushed": burst_run.flushed[1:],
              "state_bytes": state_bytes(model, optimizer),
              "format": burst_run.format() if rank == 0 else None, "rounds": args["rounds"]}
    Path(out, f"save.rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # gloo's destructor can hang at exit (see scripts/example_distributed.py)


def load_worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    join(rank, world, port)
    # burst's modules are imported before any clock starts, as DCP's are (at the top of
    # this file): a run imports burst once, when it starts, not when it restores
    import burst.parallel.sharded
    import burst.snapshot.tensors
    import burst.state.capture
    import burst.training.run

    root = Path(args["root"])
    seconds, models = {}, {}
    for key in LOADS:
        model, optimizer = build(args["hidden"], args["layers"])
        dist.barrier()
        started = time.perf_counter()
        if key == "a":
            import burst

            burst.Run("bench-a", store=str(root / "a"), global_batch=GLOBAL_BATCH,
                      micro_batch=GLOBAL_BATCH // world,
                      shadow_every=1 << 30, persist_seconds=None).attach(model, optimizer)
        elif key == "b":
            load_whole(root, model, optimizer)
        else:
            load_dcp(root, model, optimizer)
        seconds[key] = time.perf_counter() - started
        dist.barrier()
        models[key] = local_shards(model, optimizer)
    agree = all(len(models[k]) == len(models["c"]) and all(
        torch.equal(x, y) for x, y in zip(models[k], models["c"], strict=True)) for k in LOADS)
    Path(out, f"load.rank{rank}.json").write_text(json.dumps({"rank": rank, "seconds": seconds,
                                                               "agree": agree}))
    dist.barrier()
    os._exit(0)


def local_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                 ) -> list[torch.Tensor]:
    """This rank's shards of the parameters and their optimizer state, in a fixed order."""
    shards = []
    for param in model.parameters():
        state = optimizer.state.get(param, {})
        for value in [param, *(state[k] for k in sorted(state))]:
            if isinstance(value, DTensor):
                shards.append(value.to_local().clone())
    return shards


def load_whole(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """(b)'s snapshot the way a v1 restore does it: every rank reads every blob, then DCP
    cuts the full tensors into its shards."""
    from burst.parallel import sharded
    from burst.snapshot import reader
    from burst.snapshot.tensors import load_tensors
    from burst.state.capture import decode
    from burst.store import open_store

    store = open_store(str(root / "b"))
    manifest = reader.read_manifest(store, "bench-b")
    saved = decode(manifest, load_tensors(store, manifest))
    sharded.load(model, optimizer, saved["model"], saved["optimizer"])


def load_dcp(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    newest = sorted((root / "c").iterdir())[-1]
    model_state, optim_state = get_state_dict(model, optimizer)  # DCP loads in place
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(newest))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def spawn(worker: Any, world: int, args: dict, out: str) -> None:
    mp.start_processes(worker, args=(world, free_port(), args, out), nprocs=world,
                       start_method="spawn")


def table(out: Path, ranks: int, load_ranks: int) -> str:
    saves = [json.loads((out / f"save.rank{r}.json").read_text()) for r in range(ranks)]
    loads = [json.loads((out / f"load.rank{r}.json").read_text()) for r in range(load_ranks)]
    size = saves[0]["state_bytes"] / 1e6
    fmt = saves[0]["format"]
    cells = " ".join(f"{'r' + str(r):>6}" for r in range(ranks))
    lines = [f"state {size:.0f} MB (model + AdamW), {ranks} ranks, medians of "
             f"{saves[0]['rounds']} rounds; burst Run wrote format {fmt}"
             + ("" if fmt in (2, 4) else " (sharded snapshots not wired in yet: (a) is (b)'s path)"),
             "", f"{'save: blocked s per rank':<28} {cells} {'max':>6}  {'total s':>8}"
                 f"  {'max/(a)':>8}  {'total/(a)':>9}"]
    figures = {}
    for key in METHODS:
        blocked = [statistics.median(b for b, _ in s["times"][key]) for s in saves]
        total = statistics.median(t for _, t in saves[0]["times"][key])  # rank 0: committed
        figures[key] = (blocked, total)
    for key, name in METHODS.items():
        blocked, total = figures[key]
        base_blocked, base_total = max(figures["a"][0]), figures["a"][1]
        lines.append(f"{name:<28} " + " ".join(f"{b:6.2f}" for b in blocked)
                     + f" {max(blocked):6.2f}  {total:8.2f}  {max(blocked) / base_blocked:8.2f}"
                       f"  {total / base_total:9.2f}")
    lines.append(f"{'burst: until run.flush()':<28} {'':{7 * ranks}} {'':6}  "
                 f"{statistics.median(saves[0]['flushed']):8.2f}  (the commit, then pruning)")
    lines += ["", f"{'load ' + str(ranks) + ' -> ' + str(load_ranks):<28} "
                  + " ".join(f"{'r' + str(r):>6}" for r in range(load_ranks))
                  + f" {'max':>6}  max/(a)"]
    base = max(load["seconds"]["a"] for load in loads)
    for key, name in LOADS.items():
        per = [load["seconds"][key] for load in loads]
        lines.append(f"{name:<28} " + " ".join(f"{s:6.2f}" for s in per)
                     + f" {max(per):6.2f}  {max(per) / base:7.2f}")
    agree = all(load["agree"] for load in loads)
    lines.append(f"\nthe three loads give the same shards: {'yes' if agree else 'NO'}")
    return "\n".join(lines)


def main() -> None:
    args = parse()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-sharded-"))
    root.mkdir(parents=True, exist_ok=True)
    out = root / "results"
    out.mkdir(exist_ok=True)
    shared = {"root": str(root), "hidden": args.hidden, "layers": args.layers,
              "rounds": args.rounds}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        spawn(save_worker, args.ranks, shared, str(out))
        spawn(load_worker, args.load_ranks, shared, str(out))
        print(table(out, args.ranks, args.load_ranks))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Synthetic snapshots and run facts for the planner's tests (no training needed)."""

from __future__ import annotations

import json
from typing import Any

from burst.plan import memory
from burst.plan.facts import RunFacts
from burst.snapshot import format as fmt
from burst.store.base import Store

GIB = 1 << 30
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8}


def tensor_index(model: dict[str, tuple[list[int], str]],
                 optimizer: dict[int, dict[str, tuple[list[int], str]]] | None = None
                 ) -> tuple[dict[str, dict], dict[str, dict]]:
    """A manifest's ``tensors`` and ``blobs`` for the given shapes, packed in one fake blob."""
    names: dict[str, tuple[list[int], str]] = {
        f"state/model/{k}": v for k, v in model.items()}
    for index, state in (optimizer or {}).items():
        names.update({f"state/optimizer/state/{index}/{k}": v for k, v in state.items()})
    digest, offset, tensors = "ab" * 32, 0, {}
    for name, (shape, dtype) in names.items():
        nbytes = ITEMSIZE[dtype]
        for dim in shape:
            nbytes *= dim
        tensors[name] = {"blob": digest, "dtype": dtype, "shape": shape, "offset": offset,
                         "nbytes": nbytes}
        offset += (nbytes + 63) // 64 * 64
    return tensors, {digest: {"size": max(offset, 1)}}


def adam_model(n_params: int, dtype: str = "float32") -> tuple[dict, dict]:
    """One weight of ``n_params`` elements with Adam state (exp_avg, exp_avg_sq, step)."""
    return tensor_index({"w": ([n_params], dtype)},
                        {0: {"step": ([], "float32"), "exp_avg": ([n_params], dtype),
                             "exp_avg_sq": ([n_params], dtype)}})


def manifest(run_id: str = "run", *, n_params: int = 1000, peaks: dict[int, int] | None = None,
             global_batch: int = 64, micro: int = 8, world: int = 1, amp: str | None = "bf16",
             card: str = "NVIDIA GeForce RTX 4090", reason: str = "periodic", step: int = 100,
             num_samples: int = 6400, drop_last: bool = False) -> dict[str, Any]:
    tensors, blobs = adam_model(n_params)
    return {
        **fmt.format_fields(sharded=False), "run_id": run_id, "step": step, "tensors": tensors,
        "blobs": blobs, "state": {}, "reason": reason, "card": card,
        "batch": {"global": global_batch, "micro": micro,
                  "accumulation": global_batch // (micro * world), "world_size": world},
        "amp": {"dtype": amp},
        "memory": {"peak_bytes_by_micro_batch": {str(k): v for k, v in (peaks or {}).items()}},
        "counters": {"step": step, "epoch": 0, "samples_consumed": step * global_batch,
                     "samples_in_epoch": 0},
        "sampler": {"num_samples": num_samples, "seed": 0, "shuffle": True,
                    "drop_last": drop_last},
        "time": "2025-01-01T00:00:00+00:00",
    }


def put_manifest(store: Store, data: dict[str, Any]) -> None:
    store.put(fmt.manifest_key(data["run_id"], data["step"]),
              json.dumps(data, sort_keys=True).encode())


def facts(*, static_gib: float = 4, slope_gib: float | None = 0.5, global_batch: int = 64,
          micro: int = 8, world: int = 1, amp: str | None = "bf16",
          card: str = "NVIDIA GeForce RTX 4090", reason: str | None = None,
          steps_per_second: float | None = None, step: int = 0,
          total_steps: int | None = None) -> RunFacts:
    """Facts whose memory is exactly ``static + slope * micro`` (no layout extras)."""
    quarter = int(static_gib * GIB / 4)
    static = memory.Static(params=quarter, grads=quarter, optimizer=2 * quarter)
    slope = None if slope_gib is None else slope_gib * GIB
    model = memory.MemoryModel(static, static.total, slope, (), amp, world)
    return RunFacts("run", global_batch, micro, world, amp, card, model, step, reason,
                    steps_per_second, total_steps)

"""A run's batch layout: global batch, micro-batch, accumulation, world size and rank.

Frozen, because each of its numbers constrains the others (``global = micro x
accumulation x world``) and every check holds for the whole record: a re-plan (the
memory controller's smaller micro-batch) makes a new ``Layout``, never edits one.

The plan a launcher chose for this card arrives in the environment (``burst resume``
sets ``BURST_MICRO_BATCH``, ``BURST_AMP`` and the rest); ``Layout.plan`` is where it is
read and checked against what this process sees, so a wrong launch fails in one line
before any state is touched. The global batch itself never changes: each optimizer step
sees the same samples on any card.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from burst.contract import (  # the plan's names (burst.contract.PlanEnv)
    ENV_ACCUMULATION,
    ENV_AMP,
    ENV_MICRO_BATCH,
    ENV_TF32,
    ENV_WORLD_SIZE,
    env_int,
)
from burst.errors import ConfigError, SnapshotError
from burst.parallel import partition
from burst.training.sampler import ResumableSampler


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's samples split across ranks and micro-batches."""

    global_batch: int
    micro_batch: int  # in force (the memory controller may shrink it)
    accumulation: int
    world_size: int
    rank: int
    planned_micro: int  # the loader's batch: the micro-batch never grows past it

    @classmethod
    def plan(cls, global_batch: int, micro_batch: int | None, rank: int, world_size: int,
             env: Mapping[str, str] = os.environ) -> Layout:
        """The layout the code and the launch's plan (``env``) agree on; refused in one
        line when they do not."""
        global_batch = positive(global_batch, "global_batch")
        micro = positive(_env_int(env, ENV_MICRO_BATCH) or micro_batch or global_batch,
                         "micro_batch")
        layout = cls(global_batch, micro, _accumulation(global_batch, micro, world_size),
                     world_size, rank, micro)
        _check_plan_env(layout, env)
        _apply_tf32(env.get(ENV_TF32))
        return layout

    def with_micro(self, micro_batch: int) -> Layout:
        """The same run with another micro-batch (accumulation follows)."""
        return replace(self, micro_batch=micro_batch, accumulation=_accumulation(
            self.global_batch, micro_batch, self.world_size))

    def as_dict(self) -> dict[str, Any]:
        """What events and manifests record as the batch layout."""
        return {"global": self.global_batch, "micro": self.micro_batch,
                "accumulation": self.accumulation, "world_size": self.world_size}

    def epoch_steps(self, epoch_length: int, loader_drops_last: bool) -> int:
        """Optimizer steps in an epoch of ``epoch_length`` samples (a loader's dropped
        last batch is not one)."""
        if loader_drops_last:
            epoch_length = epoch_length // self.planned_micro * self.planned_micro
        return math.ceil(epoch_length / self.global_batch)

    def step_sizes(self, remaining: int, loader_drops_last: bool) -> Iterator[tuple[int, int]]:
        """(samples on all ranks, this rank's share) of each step left in the epoch."""
        if loader_drops_last:
            remaining = remaining // self.planned_micro * self.planned_micro
        partition.check_lockstep(remaining, self.global_batch, self.micro_batch,
                                 self.world_size)
        return partition.rank_steps(remaining, self.global_batch, self.rank, self.world_size)

    def adopt(self, sampler: object, saved: dict | None) -> ResumableSampler:
        """Give the loader's sampler this layout, after checking it reads the data the
        snapshot (``saved``: its sampler state) was taken on."""
        if not isinstance(sampler, ResumableSampler):
            raise ConfigError("burst needs the training DataLoader to use "
                              "sampler=burst.ResumableSampler(dataset) for an exact position")
        sampler.global_batch = self.global_batch
        sampler.rank, sampler.world_size = self.rank, self.world_size
        if saved is not None:
            check_same_data(saved, sampler.state())
        return sampler

    def check_loader(self, loader: DataLoader) -> ResumableSampler:
        """The loader ``run.steps`` iterates: its sampler (following the loader's data)
        and batch size must be this layout's, and only the sampler may drop the last
        samples (a loader's ``drop_last`` would drop per rank)."""
        if not isinstance(loader.sampler, ResumableSampler):
            raise ConfigError("run.steps() needs a DataLoader with sampler=burst.ResumableSampler")
        if loader.batch_size != self.planned_micro:
            raise ConfigError(f"the DataLoader's batch_size is {loader.batch_size}, the run's "
                              f"micro-batch {self.planned_micro}: use batch_size=run.micro_batch "
                              "(read before the first step)")
        if self.world_size > 1 and loader.drop_last:
            raise ConfigError("on several ranks use ResumableSampler(drop_last=True), not the "
                              "DataLoader's drop_last (it would drop per rank)")
        loader.sampler.follow(loader)  # a SeededDataset, whatever the sampler was built over
        return loader.sampler

    def check_snapshot(self, manifest: dict, sampler: ResumableSampler | None) -> None:
        """Refuse a snapshot this run cannot continue from exactly, before restoring it."""
        batch = manifest.get("batch", {})
        if batch.get("global") != self.global_batch:
            raise SnapshotError(
                f"the snapshot's global batch is {batch.get('global')}, this run's "
                f"{self.global_batch}: burst never changes the global batch silently"
            )
        if sampler is None:
            return
        if not isinstance(sampler, ResumableSampler):
            raise ConfigError("attach(sampler=...) takes the loader's burst.ResumableSampler")
        if manifest.get("sampler") is not None:
            check_same_data(manifest["sampler"], sampler.state())
        length = sampler.num_samples
        if sampler.drop_last:
            length = length // self.global_batch * self.global_batch
        position = (manifest.get("counters") or {}).get("samples_in_epoch", 0)
        if position > length:
            raise SnapshotError(f"the snapshot is {position} samples into an epoch of "
                                f"{length}: the data differs from the snapshot's")
        partition.check_lockstep(length - position, self.global_batch, self.micro_batch,
                                 self.world_size)


def planned_amp(given: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The precision the plan asks for (``BURST_AMP``), else the code's."""
    return env.get(ENV_AMP, given)


def check_same_data(saved: dict, live: dict) -> None:
    """The sampler reads the data the snapshot was taken on (length, seed, order)."""
    for key in ("num_samples", "seed", "shuffle", "drop_last"):
        if saved.get(key) != live.get(key):
            raise SnapshotError(f"the data differs from the snapshot's: sampler {key} was "
                                f"{saved.get(key)!r}, now {live.get(key)!r}")


def positive(value: int, name: str) -> int:
    """``value`` when it is a positive integer; a one-line ConfigError otherwise."""
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """The contract's reading of ``$name``, refused as a configuration error."""
    try:
        return env_int(env, name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _accumulation(global_batch: int, micro_batch: int, world_size: int) -> int:
    per_step = micro_batch * world_size
    if global_batch % per_step:
        raise ConfigError(f"global batch {global_batch} is not a multiple of micro-batch "
                          f"{micro_batch} x world size {world_size}")
    return global_batch // per_step


def _check_plan_env(layout: Layout, env: Mapping[str, str]) -> None:
    """A plan passed in the environment must agree with what this process computed."""
    for name, actual in ((ENV_ACCUMULATION, layout.accumulation),
                         (ENV_WORLD_SIZE, layout.world_size)):
        planned = _env_int(env, name)
        if planned is not None and planned != actual:
            raise ConfigError(f"the plan says ${name}={planned}, but this process has "
                              f"{actual}: launch with the planned number of processes")


def _apply_tf32(value: str | None) -> None:
    """TF32 matmuls on Ampere and newer when the plan says so (no effect on CPU)."""
    if value in ("1", "0"):
        enabled = value == "1"
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled

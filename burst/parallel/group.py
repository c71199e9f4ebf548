"""The ranks of a run: starting the process group from the launcher's environment, the
torchrun command line for a SkyPilot task, and the few collectives a run needs.

A training script calls :func:`init_from_env` before creating its :class:`burst.Run`; the
run then reads its rank and world size from the process group. The same script works
unchanged in one plain process (no process group: world size 1), under ``torchrun``
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), and on a
SkyPilot cluster launched one process per node (``SKYPILOT_NODE_RANK``,
``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS``). A node with several GPUs needs one
process per GPU: launch it with :func:`torchrun_command` or :func:`torchrun_shell`.

:class:`Group` carries the run's view of the ranks. Every collective in it is made at the
same point of the loop on every rank (the end of an optimizer step, a snapshot), which is
what makes a snapshot consistent: all ranks are at the same step when it is taken.
Collectives exchange JSON bytes or integers in tensors, never pickled objects.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from burst.errors import ConfigError, SnapshotError
from burst.parallel.launching import launch_from_env, url_host


def init_from_env(backend: str | None = None,
                  timeout: timedelta = timedelta(minutes=10)) -> Group:
    """Start the process group the launcher describes (or none, for one process).

    ``backend`` defaults to NCCL when CUDA is available, else gloo; on CUDA the process
    is pinned to ``cuda:LOCAL_RANK`` first. Calling it again returns the running group.
    """
    if dist.is_available() and dist.is_initialized():
        return Group.current()
    launch = launch_from_env()
    if launch is None or (launch.world_size == 1 and launch.source == "skypilot"):
        return Group()
    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available() and "nccl" in backend:
        torch.cuda.set_device(launch.local_rank)
    # torchrun's agent already serves the rendezvous store at MASTER_ADDR:MASTER_PORT and
    # env:// joins it; a SkyPilot start has no agent, so rank 0 serves it over tcp://.
    method = ("env://" if launch.source == "torchrun"
              else f"tcp://{url_host(launch.master_addr)}:{launch.master_port}")
    dist.init_process_group(backend, init_method=method, rank=launch.rank,
                            world_size=launch.world_size, timeout=timeout)
    return Group.current()


@dataclass(frozen=True)
class Group:
    """The ranks of a run (a plain process is rank 0 of 1; its collectives are no-ops)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> Group:
        """The running process group's ranks (rank 0 of 1 when none is running)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @classmethod
    def for_run(cls, world_size: int | None = None) -> Group:
        """The current ranks, checked against the world size the script expects (None:
        whatever runs), so a launcher that started the wrong number of processes, or a
        script that forgot to start the group, is caught before any sample is consumed."""
        group = cls.current()
        if world_size is not None and world_size != group.world_size:
            raise ConfigError(
                f"world_size is {world_size}, but this process group has world size "
                f"{group.world_size}: launch {world_size} processes and call "
                "burst.parallel.init_from_env() before creating the Run")
        return group

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes the snapshot and the run's events; the others contribute."""
        return self.rank == 0

    @property
    def collective(self) -> bool:
        return self.world_size > 1

    def agree(self, persist: bool, reason: str | None) -> tuple[bool, str | None]:
        """Make every rank take the same snapshot decision at a step boundary: persist if
        any rank wants to, under the reason of the highest rank that has one."""
        if not self.collective:
            return persist, reason
        votes = self._tensor([int(persist), self.rank + 1 if reason else 0])
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        persist, asker = bool(votes[0]), int(votes[1]) - 1
        if asker >= 0:
            reason = self.broadcast_json(reason, src=asker)
        return persist or asker >= 0, reason

    def broadcast_json(self, value: Any, src: int = 0) -> Any:
        """``value`` from rank ``src`` on every rank (JSON over the wire)."""
        if not self.collective:
            return value
        payload = _json_bytes(value) if self.rank == src else b""
        size = self._tensor([len(payload)])
        dist.broadcast(size, src=src)
        data = self._bytes(payload, int(size[0]))
        dist.broadcast(data, src=src)
        return json.loads(bytes(data.cpu().tolist()))

    def gather_json(self, value: Any) -> list[Any] | None:
        """Every rank's ``value``, in rank order, on rank 0 (None elsewhere)."""
        if not self.collective:
            return [value]
        payload = _json_bytes(value)
        size = self._tensor([len(payload)])
        dist.all_reduce(size, op=dist.ReduceOp.MAX)
        longest = int(size[0])
        sizes = [self._tensor([0]) for _ in range(self.world_size)] if self.is_writer else None
        dist.gather(self._tensor([len(payload)]), sizes, dst=0)
        parts = ([self._bytes(b"", longest) for _ in range(self.world_size)]
                 if self.is_writer else None)
        dist.gather(self._bytes(payload, longest), parts, dst=0)
        if parts is None or sizes is None:
            return None
        return [json.loads(bytes(p[: int(n[0])].cpu().tolist())) for p, n in zip(parts, sizes,
                                                                                 strict=True)]

    def settle(self, action: Callable[[], None]) -> None:
        """Run ``action`` on rank 0 (flushing a snapshot) and let every rank learn how it
        went, so no rank reports success for a snapshot that was not stored."""
        error: BaseException | None = None
        if self.is_writer:
            try:
                action()
            except BaseException as exc:
                error = exc
        message = self.broadcast_json(None if error is None else str(error) or type(error).__name__)
        if error is not None:
            raise error
        if message is not None:
            raise SnapshotError(f"rank 0 could not store the snapshot: {message}")

    def _device(self) -> torch.device:
        """Where collective tensors live: the current GPU for NCCL, else the CPU."""
        backend = str(dist.get_backend())
        if "nccl" in backend and "gloo" not in backend:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self._device())

    def _bytes(self, payload: bytes, length: int) -> torch.Tensor:
        data = torch.zeros(length, dtype=torch.uint8)
        if payload:
            data[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return data.to(self._device())


class StepVote:
    """The ranks' snapshot decision at each step boundary, agreed without a stall.

    :meth:`Group.agree` reads its result at once, which under NCCL is a host-device sync
    every step. Here each boundary casts its votes (persist, shadow, the highest rank
    with a reason) in an asynchronous all-reduce on CPU tensors (over gloo: a side group
    when the run's own backend is NCCL) and acts on the votes cast one boundary earlier,
    by then long arrived: every rank acts on the same votes at the same step, one step
    after they were cast. A signal or a due persist therefore takes effect one optimizer
    step later on several ranks; one process decides at once, as before.

    At every boundary every rank calls :meth:`collect`, acts on it, then :meth:`cast`s
    (both collectives, in that order), and :meth:`drain` before the group goes away.
    """

    def __init__(self, group: Group) -> None:
        self.group = group
        self._process_group: Any = None
        self._pending: tuple[Any, torch.Tensor, str | None] | None = None
        if group.collective and "gloo" not in str(dist.get_backend()):
            self._process_group = dist.new_group(backend="gloo")  # every rank, at start

    def cast(self, persist: bool, shadow: bool, reason: str | None) -> None:
        """This rank's votes at this boundary (acted on at the next one, by every rank)."""
        votes = torch.tensor([int(persist), int(shadow), self.group.rank + 1 if reason else 0],
                             dtype=torch.int64)
        work = dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self._process_group,
                               async_op=True)
        self._pending = (work, votes, reason)

    def drain(self) -> None:
        """Wait for the votes still in flight (they are not acted on)."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def collect(self) -> tuple[bool, bool, str | None]:
        """(persist, shadow, reason) the ranks voted at the previous boundary: persist and
        shadow if any rank wanted to, under the reason of the highest rank that had one."""
        if self._pending is None:
            return False, False, None
        work, votes, reason = self._pending
        self._pending = None
        work.wait()
        persist, shadow, asker = bool(votes[0]), bool(votes[1]), int(votes[2]) - 1
        if asker >= 0:  # rare: whoever asked tells the others why
            reason = self.group.broadcast_json(reason if self.group.rank == asker else None,
                                               src=asker)
        return persist or asker >= 0, shadow, reason if asker >= 0 else None


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state is the model's: DDP's ``module`` (so its keys carry no
    ``module.`` prefix and match a single-process snapshot); anything else as is."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def accumulate(step: Any, model: torch.nn.Module) -> Iterator[Any]:
    """A step's micro-batches with the gradient reduction held back until the last one.

    Under DDP (``no_sync``) or FSDP2 (``set_requires_gradient_sync``) the ranks then
    exchange gradients once per optimizer step, not once per micro-batch; on a plain
    model this is just ``iter(step)``::

        for x, y in burst.parallel.accumulate(step, model):
            (loss_fn(model(x), y) * step.weight(len(x))).backward()
    """
    for index, batch in enumerate(step):
        with _sync(model, last=index == step.micro_batches - 1):
            yield batch


@contextlib.contextmanager
def _sync(model: Any, last: bool) -> Iterator[None]:  # DDP's no_sync or FSDP2's sync switch
    if hasattr(model, "no_sync") and not last:
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield

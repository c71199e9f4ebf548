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
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from burst.errors import ConfigError, SnapshotError

DEFAULT_PORT = 29500
PORT_ENV = "BURST_MASTER_PORT"  # overrides the rendezvous port when the task runs
ENV_MASTER_PORT = "BURST_MASTER_PORT"  # the port for a SkyPilot-variables start
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """Where this process sits: what a process group needs to start."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" or "skypilot": which variables said so


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch | None:
    """The process's place from torchrun's or SkyPilot's variables; None for one process."""
    env = os.environ if env is None else env
    if all(env.get(name) for name in TORCHRUN_VARS):
        return Launch(_int(env, "RANK"), _int(env, "WORLD_SIZE"),
                      _int(env, "LOCAL_RANK", 0), env["MASTER_ADDR"],
                      _int(env, "MASTER_PORT"), "torchrun")
    if env.get("SKYPILOT_NODE_RANK") is not None and env.get("SKYPILOT_NODE_IPS"):
        return _skypilot_launch(env)
    return None


def _skypilot_launch(env: Mapping[str, str]) -> Launch:
    """One process per node, straight from SkyPilot's variables (no torchrun)."""
    gpus = _int(env, "SKYPILOT_NUM_GPUS_PER_NODE", 1)
    if gpus > 1:
        raise ConfigError(f"this node has {gpus} GPUs: start one process per GPU with "
                          "torchrun (burst.parallel.torchrun_shell)")
    ips = node_ips(env)
    nodes = _int(env, "SKYPILOT_NUM_NODES", len(ips))
    if nodes != len(ips):
        raise ConfigError(f"SKYPILOT_NUM_NODES is {nodes} but SKYPILOT_NODE_IPS lists {len(ips)}")
    port = _int(env, ENV_MASTER_PORT, DEFAULT_PORT)
    return Launch(_int(env, "SKYPILOT_NODE_RANK"), nodes, 0, ips[0], port, "skypilot")


def node_ips(env: Mapping[str, str]) -> list[str]:
    """SkyPilot's node addresses, head node first (the variable holds one per line)."""
    return [ip.strip() for ip in env.get("SKYPILOT_NODE_IPS", "").split() if ip.strip()]


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"${name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"${name} must be an integer, got {raw!r}") from None


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
              else f"tcp://{_host(launch.master_addr)}:{launch.master_port}")
    dist.init_process_group(backend, init_method=method, rank=launch.rank,
                            world_size=launch.world_size, timeout=timeout)
    return Group.current()


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def torchrun_command(script: list[str], env: Mapping[str, str] | None = None,
                     port: int = DEFAULT_PORT, python: str | None = None) -> list[str]:
    """``python -m torch.distributed.run ...`` for this node, from SkyPilot's variables.

    One node: ``--standalone`` (torchrun picks a free port). Several: a static rendezvous
    at the head node (the first of ``SKYPILOT_NODE_IPS``), as SkyPilot documents.
    """
    env = os.environ if env is None else env
    gpus = _int(env, "SKYPILOT_NUM_GPUS_PER_NODE", 1)
    ips = node_ips(env)
    nodes = _int(env, "SKYPILOT_NUM_NODES", max(len(ips), 1))
    head = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}"]
    if nodes == 1:
        return [*head, "--standalone", *script]
    if len(ips) != nodes:
        raise ConfigError(f"SKYPILOT_NUM_NODES is {nodes} but SKYPILOT_NODE_IPS lists {len(ips)}")
    return [*head, f"--nnodes={nodes}", f"--node-rank={_int(env, 'SKYPILOT_NODE_RANK')}",
            f"--master-addr={ips[0]}", f"--master-port={port}", *script]


def torchrun_shell(script: str, port: int = DEFAULT_PORT, python: str = "python") -> str:
    """The same command as a bash line for a task's ``run:`` section: SkyPilot's variables
    are read when the task runs, so one rendered template serves any cluster size. One
    node is ``--standalone`` as in :func:`torchrun_command` (torchrun picks a free port,
    so a box that already runs another job on the default one is no obstacle)."""
    return (
        'BURST_HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1) && '
        'if [ "${SKYPILOT_NUM_NODES:-1}" = 1 ]; then BURST_RDZV=(--standalone); '
        'else BURST_RDZV=(--nnodes="$SKYPILOT_NUM_NODES" --node-rank="$SKYPILOT_NODE_RANK"'
        ' --master-addr="$BURST_HEAD_IP"'
        f' --master-port="${{{PORT_ENV}:-{int(port)}}}"); fi && '
        f"{shlex.quote(python)} -m torch.distributed.run"
        ' --nproc-per-node="${SKYPILOT_NUM_GPUS_PER_NODE:-1}" "${BURST_RDZV[@]}"'
        f" {script}"
    )


def one_box_env(processes: int, address: str = "127.0.0.1") -> dict[str, str]:
    """SkyPilot's variables for a task that runs on one box no SkyPilot manages (the
    ``ssh`` launcher): node 0 of 1, ``processes`` ranks on it. The task's torchrun line and
    ``burst node run``'s plan both read them, so the processes started and the world size
    planned are the same number."""
    if processes < 1:
        raise ConfigError(f"a node runs at least one process, not {processes}")
    return {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1",
            "SKYPILOT_NODE_IPS": address, "SKYPILOT_NUM_GPUS_PER_NODE": str(processes)}


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
def _sync(model: torch.nn.Module, last: bool) -> Iterator[None]:
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

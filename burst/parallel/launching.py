"""How the ranks of a run are started: the launcher's variables (torchrun's, SkyPilot's) and
the torchrun command lines a task runs. Plain arithmetic on the environment, no torch, so
the launchers and ``burst resume`` can use it without loading torch."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from burst.errors import ConfigError

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


def url_host(addr: str) -> str:
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

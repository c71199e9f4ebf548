"""The node a wheelhouse is for: its Python, its machine, its torch build and the policy.

A wheelhouse is built on the user's machine for a node that is not there yet, so every
choice about that node is made here, once: which CPython and manylinux tags its pip
accepts, which torch build its card will want, and whether torch's multi-GB wheels go
into the store at all (``all``, ``no-torch``, ``none``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from packaging import tags as wheeltags

from burst.env import lockfile, torchvariant
from burst.env.lockfile import Lockfile
from burst.errors import ConfigError

POLICIES = ("all", "no-torch", "none")
POLICY_ENV = "BURST_WHEELS"  # the default policy: all | no-torch | none
MACHINE_ENV = "BURST_WHEELS_MACHINE"  # x86_64 | aarch64
TORCH_VARIANT_ENV = "BURST_WHEELS_TORCH"  # the torch build to store: cpu, cu128, ...
MACHINES = ("x86_64", "aarch64")
NODE_GLIBC = 35  # Ubuntu 22.04: the oldest node image burst targets has glibc 2.35


def default_policy(environ: dict[str, str] | None = None) -> str:
    value = ((os.environ if environ is None else environ).get(POLICY_ENV) or "all").strip()
    if value not in POLICIES:
        raise ConfigError(f"${POLICY_ENV} must be one of {', '.join(POLICIES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Target:
    """The node a wheelhouse is for: CPython ``python`` on Linux ``machine``."""

    python: str  # "3.11"
    machine: str = "x86_64"
    torch_variant: str | None = None  # None: the lock has no torch
    policy: str = "all"

    @property
    def platforms(self) -> list[str]:
        """manylinux tags the node's pip accepts, the newest first."""
        out = [f"manylinux_2_{minor}_{self.machine}" for minor in range(NODE_GLIBC, 16, -1)]
        out.append(f"manylinux2014_{self.machine}")
        if self.machine == "x86_64":
            out += ["manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64",
                    "manylinux1_x86_64"]
        return out

    def tags(self) -> frozenset[wheeltags.Tag]:
        """Every wheel tag the node's pip installs (``linux_*``: wheels built here)."""
        version = tuple(int(p) for p in self.python.split(".")[:2])
        platforms = [*self.platforms, f"linux_{self.machine}"]
        return frozenset([*wheeltags.cpython_tags(version, platforms=platforms),
                          *wheeltags.compatible_tags(version, f"cp{version[0]}{version[1]}",
                                                     platforms)])

    def environment(self) -> dict[str, str]:
        return lockfile.node_environment(self.python, self.machine)

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "platforms": self.platforms, "machine": self.machine,
                "torch_variant": self.torch_variant, "policy": self.policy}


def target_for(lock: Lockfile, *, machine: str | None = None, policy: str | None = None,
               torch_variant: str | None = None) -> Target:
    """The node a run bursts to: the lock's Python on Linux, torch in a CUDA build
    unless told otherwise (a CUDA lock keeps its build; a CPU or macOS one gets the build
    a Hopper card runs, the usual cloud card)."""
    machine = machine or os.environ.get(MACHINE_ENV) or "x86_64"
    if machine not in MACHINES:
        raise ConfigError(f"wheelhouse machine must be one of {', '.join(MACHINES)}, "
                          f"got {machine!r}")
    policy = policy or default_policy()
    if policy not in POLICIES:
        raise ConfigError(f"--wheels must be one of {', '.join(POLICIES)}, got {policy!r}")
    python = ".".join(lock.python.get("version", "").split(".")[:2]) or "3.10"
    torch = lock.package("torch")
    variant = torch_variant or os.environ.get(TORCH_VARIANT_ENV) or None
    if torch is not None and variant is None:
        variant = _default_variant(lock, torch.version)
    return Target(python, machine, variant if torch is not None else None, policy)


def _default_variant(lock: Lockfile, version: str) -> str:
    recorded = lock.torch_variant()
    if recorded.startswith(("cu", "rocm")):
        return recorded
    hopper = torchvariant.Target("cuda", "H100", (9, 0))
    return torchvariant.choose(version, recorded, hopper).variant

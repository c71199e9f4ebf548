"""Which wheels a wheelhouse holds: one pin per distribution of the lock the node installs.

The lock says what the run has; the target says what the node runs. A pin is what is left
of a locked distribution once the node's markers, the policy (torch or not) and the torch
build are applied, with how to obtain it: downloaded from an index, built from its source
(burst itself, the run's local packages, URL pins), or left out with a reason the node
prints. pip (and uv, when this machine uses it) are added: a node may lack ``ensurepip``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from burst.env import lockfile, torchvariant
from burst.env.lockfile import TORCH_FAMILY, Lockfile, Package
from burst.env.wheelhouse import pip
from burst.env.wheelhouse.house import BURST_DIST
from burst.env.wheelhouse.target import Target


@dataclass(frozen=True)
class Pin:
    """One distribution the wheelhouse should hold, and how to get it."""

    name: str
    version: str
    role: str
    how: str  # download | build | burst
    requirement: str  # for download/build: what pip is given
    source: str | None = None  # build: a directory or URL


def plan(lock: Lockfile, target: Target) -> tuple[list[Pin], list[dict[str, str]]]:
    """The pins to obtain for ``target``, and those left out on purpose (with why)."""
    environment = target.environment()
    recorded = lock.torch_variant()
    changed = target.torch_variant not in (None, recorded)
    with_torch = target.policy == "all"
    pins: list[Pin] = []
    left: list[dict[str, str]] = []
    for package in lock.packages:
        if not lockfile.applies(package, environment):
            continue
        is_torch = package.name in TORCH_FAMILY or package.torch_coupled
        if is_torch and not with_torch:
            left.append(_missing(package, f"policy {target.policy}: from a mirror on the node"))
        elif package.torch_coupled and changed:
            continue  # the new torch build brings its own (downloaded with its deps)
        else:
            pin = _pin(package, target, changed)
            if pin is None:
                left.append(_missing(package, "installed from a path that is not here"))
            else:
                pins.append(pin)
    if not any(p.name == BURST_DIST for p in pins):
        pins.append(Pin(BURST_DIST, _burst_version(), "burst", "burst", BURST_DIST))
    pins += [p for p in _tools() if not any(q.name == p.name for q in pins)]
    pins = [replace(p, role="tool") if p.name in ("pip", "uv") else p for p in pins]
    return pins, left


def _missing(package: Package, why: str) -> dict[str, str]:
    return {"name": package.name, "version": package.version, "why": why}


def _pin(package: Package, target: Target, changed: bool) -> Pin | None:
    if package.name == BURST_DIST:
        return Pin(package.name, package.version, "burst", "burst", package.name)
    if not package.installable:
        path = Path(package.url or "")
        if not package.url or not path.is_dir():
            return None
        return Pin(package.name, package.version, "local", "build", str(path), str(path))
    if package.source in ("url", "vcs"):
        return Pin(package.name, package.version, "dependency", "build", package.requirement(),
                   package.url)
    if package.name in TORCH_FAMILY or package.torch_coupled:
        version = package.version
        if package.name in TORCH_FAMILY and (changed or "+" in version):
            version = torchvariant.retag(version, target.torch_variant or "default")
        return Pin(package.name, version, "torch", "download", f"{package.name}=={version}")
    return Pin(package.name, package.version, "dependency", "download", package.requirement())


def _burst_version() -> str:
    from burst import __version__

    return __version__


def _tools() -> list[Pin]:
    """pip (the node may lack ensurepip) and uv when this machine uses it."""
    out = []
    for name in ("pip", "uv"):
        try:
            version: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = _uv_version() if name == "uv" else None
        if version:
            out.append(Pin(name, version, "tool", "download", f"{name}=={version}"))
    return out


def _uv_version() -> str | None:
    uv = shutil.which("uv")
    if not uv:
        return None
    with contextlib.suppress(OSError):
        done = pip.run([uv, "--version"], timeout=30)
        match = re.search(r"\b(\d+\.\d+\.\d+)\b", done.stdout)
        return match.group(1) if match else None
    return None

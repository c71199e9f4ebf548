"""Comparing a live environment with a run's lockfile.

Not every difference matters equally. A change that breaks the snapshot format (another
burst snapshot format, another torch major version, no torch at all) makes the snapshot
unreadable or unsafe to restore: an **error**. A torch minor-version change, a Python
minor change, another version or a missing package can change numerics or behaviour: a
**warning**. A translated torch build (cpu -> cu128), its CUDA libraries, an extra package
or another GPU are expected when a run moves: a **note**.

The live side is the running interpreter, or another one (``python=``) read through a
small script that prints its distributions, so ``burst env check --python .venv/bin/python``
checks an environment burst is not installed in.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from burst.env import machine as envfacts
from burst.env.lockfile import Lockfile, Package, collect_packages
from burst.errors import BurstError
from burst.snapshot.format import FORMAT_VERSION

ERROR, WARNING, NOTE = "error", "warning", "note"
_RANK = {ERROR: 0, WARNING: 1, NOTE: 2}

# Run inside another interpreter: its distributions and torch build, without importing
# torch (slow) or burst (maybe absent). Prints JSON; reads no environment variables.
_PROBE = r"""
import json, platform, re, sys
from importlib import metadata
seen = {}
for d in metadata.distributions():
    n = d.metadata["Name"] if d.metadata else None
    if n:
        seen.setdefault(re.sub(r"[-_.]+", "-", n).lower(), d.version)
try:
    from burst.snapshot.format import FORMAT_VERSION as fmt
except Exception:
    fmt = None
print(json.dumps({"packages": seen, "python": platform.python_version(), "format": fmt}))
"""


@dataclass(frozen=True)
class Difference:
    severity: str
    what: str
    recorded: str | None
    live: str | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Live:
    """The environment being checked."""

    packages: dict[str, str]
    python: str
    snapshot_format: int | None
    torch: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    facts: bool = False  # torch build and GPU were probed


def live_here(with_facts: bool = True) -> Live:
    packages = {p.name: p.version for p in collect_packages()}
    gpu = envfacts.detect_gpu() if with_facts else None
    return Live(packages, envfacts.python_facts()["version"], FORMAT_VERSION,
                envfacts.torch_facts() if with_facts else None, gpu.to_json() if gpu else None,
                facts=with_facts)


def live_in(python: str) -> Live:
    """The environment of another interpreter (packages and Python only)."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BurstError(f"cannot run {python}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BurstError(f"cannot read the environment of {python}: {last}")
    data = json.loads(done.stdout)
    return Live(data["packages"], data["python"], data.get("format"))


def compare(lock: Lockfile, live: Live) -> list[Difference]:
    """Every difference between ``lock`` and ``live``, errors first."""
    out = [*_format(lock, live), *_python(lock, live), *_torch(lock, live),
           *_packages(lock, live), *_facts(lock, live)]
    return sorted(out, key=lambda d: (_RANK[d.severity], d.what))


def worst(differences: list[Difference]) -> str | None:
    return min((d.severity for d in differences), key=_RANK.__getitem__, default=None)


def _format(lock: Lockfile, live: Live) -> list[Difference]:
    recorded = lock.burst.get("snapshot_format")
    # formats only grow, and a burst reads every format up to its own (a run frozen by an
    # older burst, format 1, resumes on one that writes format 3): only a newer is an error
    if not isinstance(recorded, int) or live.snapshot_format is None \
            or recorded <= live.snapshot_format:
        return []
    return [Difference(ERROR, "burst snapshot format", str(recorded), str(live.snapshot_format),
                       "this burst cannot read the run's snapshots")]


def _python(lock: Lockfile, live: Live) -> list[Difference]:
    recorded = lock.python.get("version", "")
    was, now = envfacts.parse_version(recorded), envfacts.parse_version(live.python)
    if was[:1] != now[:1]:
        return [Difference(ERROR, "python", recorded, live.python, "another major version")]
    if was[:2] != now[:2]:
        return [Difference(WARNING, "python", recorded, live.python,
                           "another minor version: pinned wheels may differ")]
    if was != now:
        return [Difference(NOTE, "python", recorded, live.python, "patch release")]
    return []


def _torch(lock: Lockfile, live: Live) -> list[Difference]:
    entry = lock.package("torch")
    if entry is None:
        return []
    now = live.packages.get("torch")
    if now is None:
        return [Difference(ERROR, "torch", entry.version, None,
                           "torch is missing: the run's snapshots cannot be restored")]
    return [_torch_version(entry.version, now)] if entry.version != now else []


def _torch_version(recorded: str, live: str) -> Difference:
    was, now = envfacts.parse_version(recorded), envfacts.parse_version(live)
    if was[:1] != now[:1]:
        return Difference(ERROR, "torch", recorded, live,
                          "another major version: the snapshot format is not guaranteed")
    if was[:2] != now[:2]:
        return Difference(WARNING, "torch", recorded, live,
                          "another minor version: numerics and kernels may differ")
    if was != now:
        return Difference(NOTE, "torch", recorded, live, "patch release")
    return Difference(NOTE, "torch", recorded, live, "another build of the same release")


def _packages(lock: Lockfile, live: Live) -> list[Difference]:
    variant_changed = _variant(lock, live)
    out = []
    recorded = {p.name: p for p in lock.packages if p.name != "torch"}
    for name, package in recorded.items():
        now = live.packages.get(name)
        if now == package.version:
            continue
        out.append(_package_difference(package, now, variant_changed))
    for name in sorted(set(live.packages) - set(recorded) - {"torch"}):
        out.append(Difference(NOTE, name, None, live.packages[name], "not in the lockfile"))
    return out


def _package_difference(package: Package, now: str | None, variant_changed: bool
                        ) -> Difference:
    if package.torch_coupled and variant_changed:
        return Difference(NOTE, package.name, package.version, now,
                          "follows the torch build")
    if package.name in ("torchvision", "torchaudio") and now and variant_changed and (
            now.partition("+")[0] == package.version.partition("+")[0]):
        return Difference(NOTE, package.name, package.version, now, "follows the torch build")
    if not package.installable:
        return Difference(NOTE, package.name, package.version, now,
                          f"{package.source} install on the source machine: "
                          f"{'travels in the code archive' if package.in_code else 'not portable'}")
    if now is None:
        return Difference(WARNING, package.name, package.version, None, "missing")
    return Difference(WARNING, package.name, package.version, now, "another version")


def _variant(lock: Lockfile, live: Live) -> bool:
    entry = lock.package("torch")
    now = live.packages.get("torch")
    return bool(entry and now and entry.version.partition("+")[2] != now.partition("+")[2])


def _facts(lock: Lockfile, live: Live) -> list[Difference]:
    if not live.facts:
        return []  # another interpreter: its build and machine were not probed
    pairs = [("torch cuda", lock.torch, live.torch, "cuda"),
             ("cudnn", lock.torch, live.torch, "cudnn"),
             ("gpu", lock.gpu, live.gpu, "name"),
             ("gpu driver", lock.gpu, live.gpu, "driver")]
    out = []
    for what, was, now, key in pairs:
        before, after = (was or {}).get(key), (now or {}).get(key)
        if before != after:
            out.append(Difference(NOTE, what, _str(before), _str(after), "another machine"))
    return out


def _str(value: Any) -> str | None:
    return None if value is None else str(value)

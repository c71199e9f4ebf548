"""What a wheelhouse is: its wheels (name, version, file, hash, role) and the names they go by.

Every other part of the wheelhouse speaks these records: the plan fills a house, the
fetch, build and repack steps add wheels to it, the store keeps them under their hash.
Wheel file names are parsed here once, so a cached, built or downloaded wheel is read the
same way everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from burst.env import lockfile
from burst.env.wheelhouse.target import Target
from burst.errors import BurstError
from burst.store.base import check_key

FORMAT = 1
BURST_DIST = "burst-failover"
ROLES = ("dependency", "burst", "local", "torch", "tool")

Say = Callable[[str], None]


class WheelhouseError(BurstError):
    """A wheelhouse could not be built, stored or fetched."""


def wheel_key(sha256: str, filename: str) -> str:
    return check_key(f"wheels/{sha256}/{filename}")


@dataclass
class Wheel:
    name: str
    version: str
    file: str
    sha256: str
    size: int
    role: str
    path: Path | None = None  # where it lies on this machine (not in the index)
    repacked: bool = False  # rebuilt from the files installed here, not fetched or built


    @property
    def key(self) -> str:
        return wheel_key(self.sha256, self.file)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        data["key"] = self.key
        return data


@dataclass
class Wheelhouse:
    target: Target
    wheels: list[Wheel] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)

    def index(self) -> dict[str, Any]:
        wheels = sorted(self.wheels, key=lambda w: (w.name, w.file))
        return {"format": FORMAT, "target": self.target.to_json(),
                "wheels": [w.to_json() for w in wheels],
                "missing": sorted(self.missing, key=lambda m: m["name"])}

    @property
    def bytes(self) -> int:
        return sum(w.size for w in self.wheels)


def parse_name(filename: str) -> tuple[str, str, frozenset] | None:
    """``(normalized name, version, tags)`` of a wheel file name; None when it is not one."""
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return lockfile.normalize(str(name)), str(version), frozenset(tags)


def same_version(a: str, b: str) -> bool:
    """``1.0`` is ``1.0.0``: versions compare as versions, and as text when they are not."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wheel_at(path: Path, role: str, *, repacked: bool = False) -> Wheel:
    """The record of a wheel file on this machine (hashed now)."""
    parsed = parse_name(path.name)
    name, version = (parsed[0], parsed[1]) if parsed else (path.name, "")
    return Wheel(name, version, path.name, sha256_of(path), path.stat().st_size, role, path,
                 repacked)

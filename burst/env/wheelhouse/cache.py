"""The wheel cache on this machine (where it lies: :mod:`burst.staging.wheelcache`).

Freezing again must download nothing: a torch build with its CUDA libraries is 3-4 GB.
Downloads lie in ``files/``; a wheel that came with its dependencies (a new torch build)
has a listing of them in ``deps/`` and counts as cached only with all of them.
"""

from __future__ import annotations

import json
from pathlib import Path

from burst.env.wheelhouse.house import parse_name, same_version
from burst.env.wheelhouse.pins import Pin


def cached(files: Path, pin: Pin, accepted: frozenset) -> Path | None:
    """A wheel of ``pin`` at its version already downloaded, with tags the node accepts."""
    for path in sorted(files.glob("*.whl")):
        parsed = parse_name(path.name)
        if parsed and parsed[0] == pin.name and same_version(parsed[1], pin.version) \
                and parsed[2] & accepted:
            return path
    return None


def deps_file(root: Path, wheel: Path) -> Path:
    return root / "deps" / f"{wheel.name}.json"


def deps_cached(root: Path, wheel: Path) -> bool:
    """A wheel downloaded with its dependencies (a new torch build) is cached only with
    them; every other wheel stands alone."""
    listing = deps_file(root, wheel)
    if not listing.exists():
        return True
    try:
        names = json.loads(listing.read_text())
    except (OSError, ValueError):
        return False
    return all((wheel.parent / n).exists() for n in names)


def cached_deps(root: Path, wheel: Path) -> dict[str, Path]:
    """``{name: wheel}`` of the dependencies that came with ``wheel``."""
    listing = deps_file(root, wheel)
    if not listing.exists():
        return {}
    out = {}
    for name in json.loads(listing.read_text()):
        parsed = parse_name(name)
        if parsed and name != wheel.name:
            out[parsed[0]] = wheel.parent / name
    return out

"""Assembling a wheelhouse: every pin obtained the cheapest way that works, or listed missing.

The order is the cost order: the wheel cache here, then pip (one probe first, so an
unreachable index costs seconds, not a timeout per pin), then the distributions installed
in the environment being frozen, then a build from source. What none of them yields is
listed as missing with why, for the node to take from a mirror; only a problem the user
must fix raises.
"""

from __future__ import annotations

from pathlib import Path

from burst.env.lockfile import Lockfile
from burst.env.wheelhouse import cache as wheelcache
from burst.env.wheelhouse import reach
from burst.env.wheelhouse.fetch import download_pins
from burst.env.wheelhouse.house import Say, Wheelhouse, wheel_at
from burst.env.wheelhouse.pins import Pin, plan
from burst.env.wheelhouse.repack import repack_installed
from burst.env.wheelhouse.source import build_one
from burst.env.wheelhouse.target import Target
from burst.staging.wheelcache import cache_dir


def build(lock: Lockfile, target: Target, *, cache: Path | None = None,
          torch_index: str | None = None, say: Say | None = None,
          paths: list[str] | None = None) -> Wheelhouse:
    """Obtain a wheel for every pin of ``lock`` on ``target`` (cached here); what cannot
    be had is listed as missing, with why. Raises only for a problem the user must fix.

    A pin pip cannot fetch (no index reachable, or not on it) is repacked from the
    environment being frozen (``paths``: where its distributions are; None: this
    interpreter's) when installed there at that version with tags that run on the node."""
    say = say or (lambda _line: None)
    house = Wheelhouse(target)
    if target.policy == "none":
        return house
    root = (cache or cache_dir()).expanduser()
    (root / "files").mkdir(parents=True, exist_ok=True)
    pins, house.missing = plan(lock, target)
    found, extra, todo = _from_cache(pins, root, target)
    downloads = [p for p in todo if p.how == "download"]
    offline = reach.offline(say) if downloads else None
    failed = downloads if offline else download_pins(downloads, target, lock, root, found,
                                                     extra, torch_index, say)
    offline = offline or next((str(p.source) for p in failed if reach.unreachable(p.source)),
                              None)
    repacked = repack_installed(failed, target, root, paths, say)
    found.update({name: path for name, (path, _) in repacked.items() if path is not None})
    for pin in [p for p in todo if p.how != "download"] + failed:
        if pin.name not in found:
            _build_or_miss(pin, house, found, repacked, root, target, offline, say)
    roles = {p.name: p.role for p in pins}
    for name, path in [*extra.items(), *found.items()]:
        house.wheels.append(wheel_at(path, roles.get(name, "torch"),
                                     repacked=repacked.get(name, (None, ""))[0] == path))
    house.wheels = list({w.file: w for w in house.wheels}.values())
    return house


def _from_cache(pins: list[Pin], root: Path, target: Target
                ) -> tuple[dict[str, Path], dict[str, Path], list[Pin]]:
    """The pins the wheel cache already has (with the dependencies that came with them),
    and the pins still to obtain."""
    accepted = target.tags()
    found: dict[str, Path] = {}
    extra: dict[str, Path] = {}
    todo: list[Pin] = []
    for pin in pins:
        cached = wheelcache.cached(root / "files", pin, accepted) \
            if pin.how == "download" else None
        if cached is not None and wheelcache.deps_cached(root, cached):
            found[pin.name] = cached
            extra.update(wheelcache.cached_deps(root, cached))
        else:
            todo.append(pin)
    return found, extra, todo


def _build_or_miss(pin: Pin, house: Wheelhouse, found: dict[str, Path],
                   repacked: dict[str, tuple[Path | None, str]], root: Path, target: Target,
                   offline: str | None, say: Say) -> None:
    """Build ``pin`` from source, or list it missing: torch is never built (hours), and
    with no index reachable no sdist comes."""
    unfit = repacked.get(pin.name, (None, ""))[1]
    if pin.role == "torch" or (offline and pin.how == "download"):
        why = unfit or (reach.as_unreachable(offline) if offline
                        else f"no wheel for the node: {pin.source}")
        house.missing.append({"name": pin.name, "version": pin.version, "why": why})
        return
    path, why = build_one(pin, root, target.tags(), say, isolated=not offline)
    if path is not None:
        found[pin.name] = path
    else:
        house.missing.append({"name": pin.name, "version": pin.version, "why": why})

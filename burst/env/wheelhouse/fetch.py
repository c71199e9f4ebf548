"""Downloading the node's wheels with pip, in as few pip calls as possible.

``pip download --only-binary=:all: --platform ...`` through whatever indexes pip is
configured with here: one call for every plain pin, one for the torch family (from the
PyTorch index of the chosen build, with its dependencies when the build changes, resolved
against the lock's pins). A pin pip has no wheel for is found from pip's own words and set
aside (to be built or listed as missing) while the rest of the batch goes on; an index
that is down fails every pin alike, at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from burst.contract import ENV_TORCH_INDEX
from burst.env import lockfile, pkgindex, torchvariant
from burst.env.lockfile import TORCH_FAMILY, Lockfile
from burst.env.wheelhouse import pip, reach
from burst.env.wheelhouse.cache import deps_file
from burst.env.wheelhouse.house import Say, parse_name
from burst.env.wheelhouse.pins import Pin
from burst.env.wheelhouse.target import Target

_NO_MATCH = re.compile(r"(?:No matching distribution found for|Could not find a version that "
                       r"satisfies the requirement)\s+([A-Za-z0-9._-]+)")


def download_pins(pins: list[Pin], target: Target, lock: Lockfile, root: Path,
                  found: dict[str, Path], extra: dict[str, Path], torch_index: str | None,
                  say: Say) -> list[Pin]:
    """Download ``pins`` in as few pip calls as possible; return the pins pip has no wheel
    for (to build from source, or to list as missing)."""
    if not pins:
        return []
    recorded = lock.torch_variant()
    changed = target.torch_variant not in (None, recorded)
    plain = [p for p in pins if not (p.role == "torch" and p.name in TORCH_FAMILY)]
    torch = [p for p in pins if p not in plain]
    failed = _download_batch(plain, target, root, found, say, deps=False)
    if torch and any(reach.unreachable(p.source) for p in failed):
        failed += torch
    elif torch:
        index = _torch_index(lock, target, torch_index)
        failed += _download_batch(torch, target, root, found, say, deps=changed,
                                  index=index, constraints=_constraints(lock), extra=extra)
    return failed


def _torch_index(lock: Lockfile, target: Target, override: str | None) -> str | None:
    template = (override or os.environ.get(ENV_TORCH_INDEX) or lock.torch_index_template()
                or pkgindex.DEFAULT_TORCH_INDEX)
    variant = target.torch_variant or "default"
    return torchvariant.index_url(variant, template) if "{variant}" in template else template


def _constraints(lock: Lockfile) -> list[str]:
    """The lock's pins, so a new torch build's dependencies resolve to them where pinned."""
    return [p.requirement() for p in lock.packages
            if p.installable and p.source == "index" and not p.torch_coupled
            and p.name not in TORCH_FAMILY]


def _download_batch(pins: list[Pin], target: Target, root: Path, found: dict[str, Path],
                    say: Say, *, deps: bool, index: str | None = None,
                    constraints: list[str] | None = None,
                    extra: dict[str, Path] | None = None) -> list[Pin]:
    failed: list[Pin] = []
    pending = list(pins)
    while pending:
        say(f"downloading {len(pending)} wheel(s) for {target.machine} / python "
            f"{target.python}")
        ok, output, saved = _pip_download(pending, target, root, deps, index, constraints)
        if ok:
            _collect(pending, saved, root, found, extra, deps)
            break
        down = reach.connection_line(output)
        if down is not None:  # the index is down: every pin fails alike, at once
            say(f"{reach.UNREACHABLE} ({down}): wheels come from this environment")
            failed += [replace(p, source=f"{reach.UNREACHABLE}: {down}") for p in pending]
            break
        match = _NO_MATCH.search(output)
        bad = next((p for p in pending if match
                    and lockfile.normalize(match.group(1)) == p.name), None)
        if bad is None:  # an error pip does not pin on one requirement: try one by one
            if len(pending) == 1:
                failed.append(replace(pending[0], source=pip.reason(output)))
                break
            for pin in pending:
                failed += _download_batch([pin], target, root, found, say, deps=deps,
                                          index=index, constraints=constraints, extra=extra)
            break
        failed.append(replace(bad, source=pip.reason(output)))
        pending.remove(bad)
    return failed


def _pip_download(pins: list[Pin], target: Target, root: Path, deps: bool,
                  index: str | None, constraints: list[str] | None
                  ) -> tuple[bool, str, list[Path]]:
    files = root / "files"
    with tempfile.TemporaryDirectory(prefix="dl-", dir=root) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{p.requirement}\n" for p in pins))
        command = [*pip.command(), "download", "--only-binary=:all:", "--dest",
                   str(Path(tmp) / "out"), "--python-version", target.python,
                   "--implementation", "cp", "-r", str(requirements), "--progress-bar", "off",
                   *(["--no-deps"] if not deps else []),
                   *(["--extra-index-url", index] if index else []),
                   *(["--find-links", str(b)] for b in _bundled() if b),
                   *_cached_links(files)]
        for platform in target.platforms:
            command += ["--platform", platform]
        if constraints and deps:
            (Path(tmp) / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints))
            command += ["-c", str(Path(tmp) / "constraints.txt")]
        done = pip.run(_flatten(command), timeout=pip.PIP_TIMEOUT)
        if done.returncode != 0:
            return False, done.stdout + done.stderr, []
        saved = []
        for path in sorted((Path(tmp) / "out").glob("*.whl")):
            dest = files / path.name
            if not dest.exists():
                shutil.move(str(path), dest)
            saved.append(dest)
        return True, done.stdout, saved


def _flatten(command: list[Any]) -> list[str]:
    out: list[str] = []
    for part in command:
        out += part if isinstance(part, list) else [part]
    return out


def _cached_links(files: Path) -> list[list[str]]:
    return [["--find-links", str(files)]] if any(files.glob("*.whl")) else []


def _bundled() -> list[Path]:
    """The pip (and setuptools) wheels this Python ships for ``ensurepip``: found here
    even when no index is reachable."""
    try:
        import ensurepip
    except ImportError:
        return []
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    return [bundled] if bundled.is_dir() else []


def _collect(pins: list[Pin], saved: list[Path], root: Path, found: dict[str, Path],
             extra: dict[str, Path] | None, deps: bool) -> None:
    by_name: dict[str, list[Path]] = {}
    for path in saved:
        parsed = parse_name(path.name)
        if parsed:
            by_name.setdefault(parsed[0], []).append(path)
    for pin in pins:
        for path in by_name.pop(pin.name, []):
            found[pin.name] = path
            if deps:
                listing = deps_file(root, path)
                listing.parent.mkdir(parents=True, exist_ok=True)
                listing.write_text(json.dumps(sorted(p.name for p in saved)))
    if extra is not None:
        for name, paths in by_name.items():
            if name not in found:
                extra[name] = paths[0]

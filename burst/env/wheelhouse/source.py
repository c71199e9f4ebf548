"""Building wheels here from source: burst's own, the run's local packages, URL pins, and
sdist-only pins.

burst and the run's editable packages are never taken from an index (the code running now
is what the node must run); an sdist-only pin is built when it builds. torch never comes
here: building it takes hours. Built wheels get fixed timestamps, so equal code hashes
equal, and are kept under their hash, since two builds of one version may differ.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from burst.env.wheelhouse import pip
from burst.env.wheelhouse.house import BURST_DIST, Say, WheelhouseError, parse_name, sha256_of
from burst.env.wheelhouse.pins import Pin
from burst.env.wheelhouse.repack import repack

_EPOCH = "315532800"  # 1980-01-01: built wheels get fixed timestamps, so equal code hashes equal


def build_one(pin: Pin, root: Path, accepted: frozenset, say: Say, *,
              isolated: bool = True) -> tuple[Path | None, str]:
    """Build one wheel here: burst's own, a local project, a URL, or an sdist-only pin
    (``isolated``: try build isolation first; pointless with no index)."""
    try:
        if pin.how == "burst":
            path = _burst_wheel(root, say, isolated)
        elif pin.how == "build":
            path = _pip_wheel(pin.requirement, root, say, isolated)
        else:  # pip found no wheel for the node: maybe an sdist it can build
            say(f"{pin.name} {pin.version}: no wheel for the node, building it from source")
            path = _pip_wheel(pin.requirement, root, say, isolated)
    except WheelhouseError as error:
        why = str(error)
        if pin.how == "download":
            why = f"no wheel for the node, and building from source failed: {why}"
        return None, why
    parsed = parse_name(path.name)
    if parsed is None or not parsed[2] & accepted:
        return None, f"built {path.name}, which does not run on the node"
    return path, ""


def _pip_wheel(requirement: str, root: Path, say: Say, isolated: bool = True) -> Path:
    """``pip wheel --no-deps``; without build isolation as a second try (a machine that
    cannot reach an index may still have the build backend installed)."""
    out = root / "built"
    out.mkdir(parents=True, exist_ok=True)
    errors = []
    for isolation in ([], ["--no-build-isolation"])[0 if isolated else 1:]:
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=root) as tmp:
            command = [*pip.command(), "wheel", "--no-deps", "--wheel-dir", tmp,
                       *isolation, requirement]
            done = pip.run(command, timeout=pip.PIP_TIMEOUT,
                           env={**os.environ, "SOURCE_DATE_EPOCH": _EPOCH})
            made = sorted(Path(tmp).glob("*.whl"))
            if done.returncode == 0 and made:
                return _keep(made[0], out)
            errors.append(pip.reason(done.stdout + done.stderr))
        if not isolation:
            say(f"building {requirement} with build isolation failed; trying without")
    raise WheelhouseError(f"cannot build a wheel of {requirement}: {errors[-1]}")


def _keep(path: Path, out: Path) -> Path:
    """Keep a built wheel under its hash: two builds of one version may differ."""
    digest = sha256_of(path)
    dest = out / digest[:16] / path.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), dest)
    return dest


def _burst_wheel(root: Path, say: Say, isolated: bool = True) -> Path:
    """burst's own wheel, from the code running now: rebuilt from its source tree when it
    is an editable/source install, repacked from its installed files otherwise."""
    import burst

    package = Path(burst.__file__).resolve().parent
    project = package.parent
    if (project / "pyproject.toml").exists():
        with tempfile.TemporaryDirectory(prefix="burst-src-", dir=root) as tmp:
            copy = Path(tmp) / "burst-failover"
            shutil.copytree(package, copy / "burst",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            for extra in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "setup.py"):
                if (project / extra).exists():
                    shutil.copy2(project / extra, copy / extra)
            return _pip_wheel(str(copy), root, say, isolated)
    return repack(metadata.distribution(BURST_DIST), root)

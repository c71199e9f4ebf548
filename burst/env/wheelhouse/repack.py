"""The wheelhouse: every pinned distribution of a lockfile as a wheel, in the store.

A node in Beijing often reaches no package index at all, so it must get the run's whole
environment from the store, burst itself included. At freeze and push time (on the user's
machine, which can reach its index) every pin is turned into a wheel for the node's platform
(manylinux x86_64 or aarch64, the lock's CPython) and stored content-addressed at
``wheels/<sha256>/<file>``, shared by every run in the store, so a wheel is uploaded once
per store, ever. Each lockfile gets an index, ``<run>/env/wheelhouse-<lock digest>.json``,
that names its wheels (with their role) and what could not be had ("missing", with why):
the node installs from the wheelhouse first and asks a mirror only for the missing.

Wheels come from pip (``pip download --only-binary=:all: --platform ...``, through whatever
indexes pip is configured with here), or are built here: burst's own wheel and the run's
editable/local packages from their source (never from an index), sdist-only pins when
they build. torch follows the card's build (:mod:`burst.env.torchvariant`); the ``policy``
decides whether its multi-GB wheels go into the store at all. Downloads are kept in
``~/.cache/burst/wheels`` (``$BURST_WHEEL_CACHE``), so freezing again downloads nothing.

Where pip cannot fetch a pin (no index reachable: found out once, by one probe or the first
failed batch, never pin by pin; or the pin is not on it), the distribution installed in the
environment being frozen is repacked into a wheel when its ``WHEEL`` tags run on the node
(a macOS or Windows build does not: it is listed missing). The index marks those wheels
``"repacked": true``. A resumed run that freezes its node's environment again reuses an
index whose wheels cover its pins instead of building one.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging import tags as wheeltags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from burst.env import lockfile, pkgindex, spawn, torchvariant
from burst.env.lockfile import TORCH_FAMILY, Lockfile, Package
from burst.errors import BurstError, ConfigError
from burst.redact import strip_url
from burst.store.base import Pace, Store, check_key
from burst.store.files import upload_files
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retrying

FORMAT = 1
POLICIES = ("all", "no-torch", "none")
# pip downloads torch with its CUDA libraries (3-4 GB) on a slow link: generous, not endless
PIP_TIMEOUT = 3 * 3600.0
POLICY_ENV = "BURST_WHEELS"  # the default policy: all | no-torch | none
MACHINE_ENV = "BURST_WHEELS_MACHINE"  # x86_64 | aarch64
TORCH_VARIANT_ENV = "BURST_WHEELS_TORCH"  # the torch build to store: cpu, cu128, ...
CACHE_ENV = "BURST_WHEEL_CACHE"
MACHINES = ("x86_64", "aarch64")
NODE_GLIBC = 35  # Ubuntu 22.04: the oldest node image burst targets has glibc 2.35
BURST_DIST = "burst-failover"
ROLES = ("dependency", "burst", "local", "torch", "tool")
INDEX_FILE = "wheelhouse.json"  # the index, beside the wheels of a downloaded wheelhouse

Say = Callable[[str], None]


class WheelhouseError(BurstError):
    """A wheelhouse could not be built, stored or fetched."""


def wheel_key(sha256: str, filename: str) -> str:
    return check_key(f"wheels/{sha256}/{filename}")


def index_key(run_id: str, digest: str) -> str:
    return check_key(f"{run_id}/env/wheelhouse-{digest}.json")


def default_policy(environ: dict[str, str] | None = None) -> str:
    value = ((os.environ if environ is None else environ).get(POLICY_ENV) or "all").strip()
    if value not in POLICIES:
        raise ConfigError(f"${POLICY_ENV} must be one of {', '.join(POLICIES)}, got {value!r}")
    return value


def cache_dir() -> Path:
    """Where downloaded and built wheels are kept between freezes."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "burst" / "wheels")


# -- the target ---------------------------------------------------------------------------

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


# -- what goes in -------------------------------------------------------------------------

@dataclass(frozen=True)
class Pin:
    """One distribution the wheelhouse should hold, and how to get it."""

    name: str
    version: str
    role: str
    how: str  # download | build | burst
    requirement: str  # for download/build: what pip is given
    source: str | None = None  # build: a directory or URL


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
        done = _run([uv, "--version"], timeout=30)
        match = re.search(r"\b(\d+\.\d+\.\d+)\b", done.stdout)
        return match.group(1) if match else None
    return None


# -- building -----------------------------------------------------------------------------

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
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    pins, house.missing = plan(lock, target)
    accepted = target.tags()
    found: dict[str, Path] = {}
    extra: dict[str, Path] = {}
    todo: list[Pin] = []
    for pin in pins:
        cached = _cached(files, pin, accepted) if pin.how == "download" else None
        if cached is not None and _deps_cached(root, cached):
            found[pin.name] = cached
            extra.update(_cached_deps(root, cached))
        else:
            todo.append(pin)
    downloads = [p for p in todo if p.how == "download"]
    offline = _offline(say) if downloads else None
    failed = downloads if offline else _download(downloads, target, lock, root, found, extra,
                                                 torch_index, say)
    offline = offline or next((str(p.source) for p in failed if _unreachable(p.source)), None)
    repacked = _repack_installed(failed, target, root, paths, say)
    found.update({name: path for name, (path, _) in repacked.items() if path is not None})
    for pin in [p for p in todo if p.how != "download"] + failed:
        if pin.name in found:
            continue
        unfit = repacked.get(pin.name, (None, ""))[1]
        if pin.role == "torch" or (offline and pin.how == "download"):
            why = unfit or (_as_unreachable(offline) if offline
                            else f"no wheel for the node: {pin.source}")
            house.missing.append({"name": pin.name, "version": pin.version, "why": why})
            continue  # torch is never built from source (hours); offline no sdist comes
        path, why = _build_one(pin, root, accepted, say, isolated=not offline)
        if path is not None:
            found[pin.name] = path
        else:
            house.missing.append({"name": pin.name, "version": pin.version, "why": why})
    roles = {p.name: p.role for p in pins}
    for name, path in [*extra.items(), *found.items()]:
        house.wheels.append(_wheel(path, roles.get(name, "torch"),
                                   repacked=repacked.get(name, (None, ""))[0] == path))
    house.wheels = list({w.file: w for w in house.wheels}.values())
    return house


def _cached(files: Path, pin: Pin, accepted: frozenset) -> Path | None:
    for path in sorted(files.glob("*.whl")):
        parsed = _parse(path.name)
        if parsed and parsed[0] == pin.name and _same_version(parsed[1], pin.version) \
                and parsed[2] & accepted:
            return path
    return None


def _parse(filename: str) -> tuple[str, str, frozenset] | None:
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return lockfile.normalize(str(name)), str(version), frozenset(tags)


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _deps_file(root: Path, wheel: Path) -> Path:
    return root / "deps" / f"{wheel.name}.json"


def _deps_cached(root: Path, wheel: Path) -> bool:
    """A wheel downloaded with its dependencies (a new torch build) is cached only with
    them; every other wheel stands alone."""
    listing = _deps_file(root, wheel)
    if not listing.exists():
        return True
    try:
        names = json.loads(listing.read_text())
    except (OSError, ValueError):
        return False
    return all((wheel.parent / n).exists() for n in names)


def _cached_deps(root: Path, wheel: Path) -> dict[str, Path]:
    listing = _deps_file(root, wheel)
    if not listing.exists():
        return {}
    out = {}
    for name in json.loads(listing.read_text()):
        parsed = _parse(name)
        if parsed and name != wheel.name:
            out[parsed[0]] = wheel.parent / name
    return out


def _download(pins: list[Pin], target: Target, lock: Lockfile, root: Path,
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
    if torch and any(_unreachable(p.source) for p in failed):
        failed += torch
    elif torch:
        index = _torch_index(lock, target, torch_index)
        failed += _download_batch(torch, target, root, found, say, deps=changed,
                                  index=index, constraints=_constraints(lock), extra=extra)
    return failed


def _torch_index(lock: Lockfile, target: Target, override: str | None) -> str | None:
    template = (override or os.environ.get("BURST_TORCH_INDEX") or lock.torch_index_template()
                or pkgindex.DEFAULT_TORCH_INDEX)
    variant = target.torch_variant or "default"
    return torchvariant.index_url(variant, template) if "{variant}" in template else template


def _constraints(lock: Lockfile) -> list[str]:
    """The lock's pins, so a new torch build's dependencies resolve to them where pinned."""
    return [p.requirement() for p in lock.packages
            if p.installable and p.source == "index" and not p.torch_coupled
            and p.name not in TORCH_FAMILY]


_NO_MATCH = re.compile(r"(?:No matching distribution found for|Could not find a version that "
                       r"satisfies the requirement)\s+([A-Za-z0-9._-]+)")


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
        down = _connection_line(output)
        if down is not None:  # the index is down: every pin fails alike, at once
            say(f"package index unreachable ({down}): wheels come from this environment")
            failed += [replace(p, source=f"package index unreachable: {down}")
                       for p in pending]
            break
        match = _NO_MATCH.search(output)
        bad = next((p for p in pending if match
                    and lockfile.normalize(match.group(1)) == p.name), None)
        if bad is None:  # an error pip does not pin on one requirement: try one by one
            if len(pending) == 1:
                failed.append(replace(pending[0], source=_last_line(output)))
                break
            for pin in pending:
                failed += _download_batch([pin], target, root, found, say, deps=deps,
                                          index=index, constraints=constraints, extra=extra)
            break
        failed.append(replace(bad, source=_last_line(output)))
        pending.remove(bad)
    return failed


def _pip_download(pins: list[Pin], target: Target, root: Path, deps: bool,
                  index: str | None, constraints: list[str] | None
                  ) -> tuple[bool, str, list[Path]]:
    files = root / "files"
    with tempfile.TemporaryDirectory(prefix="dl-", dir=root) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{p.requirement}\n" for p in pins))
        command = [*_pip_command(), "download", "--only-binary=:all:", "--dest",
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
        done = _run(_flatten(command), timeout=PIP_TIMEOUT)
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


@dataclass(frozen=True)
class _Ran:
    """A helper program's end as the wheelhouse reads it (text, a timeout as a failure)."""

    returncode: int
    stdout: str
    stderr: str


def _run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> _Ran:
    """Run pip (or uv) through :mod:`burst.env.spawn`: the wheelhouse is built in the
    freeze thread of a training process whose DataLoader may fork at any moment, and a
    ``subprocess`` pipe inherited by a forked worker would hang this thread for good."""
    done = spawn.run(argv, timeout=timeout, env=env)
    stderr = done.stderr.decode(errors="replace")
    if done.returncode is None:
        stderr += f"\n{argv[0]} did not finish within {timeout:.0f} s"
    return _Ran(-1 if done.returncode is None else done.returncode,
                done.stdout.decode(errors="replace"), stderr)


def _pip_command() -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _collect(pins: list[Pin], saved: list[Path], root: Path, found: dict[str, Path],
             extra: dict[str, Path] | None, deps: bool) -> None:
    by_name: dict[str, list[Path]] = {}
    for path in saved:
        parsed = _parse(path.name)
        if parsed:
            by_name.setdefault(parsed[0], []).append(path)
    for pin in pins:
        for path in by_name.pop(pin.name, []):
            found[pin.name] = path
            if deps:
                listing = _deps_file(root, path)
                listing.parent.mkdir(parents=True, exist_ok=True)
                listing.write_text(json.dumps(sorted(p.name for p in saved)))
    if extra is not None:
        for name, paths in by_name.items():
            if name not in found:
                extra[name] = paths[0]


def _last_line(output: str) -> str:
    """pip's own reason: its first ``ERROR:`` line that names one, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")
              and "ResolutionImpossible" not in line]
    return (errors[0] if errors else lines[-1] if lines else "pip failed")[:300]


def _build_one(pin: Pin, root: Path, accepted: frozenset, say: Say, *,
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
    parsed = _parse(path.name)
    if parsed is None or not parsed[2] & accepted:
        return None, f"built {path.name}, which does not run on the node"
    return path, ""


_EPOCH = "315532800"  # 1980-01-01: built wheels get fixed timestamps, so equal code hashes equal


def _pip_wheel(requirement: str, root: Path, say: Say, isolated: bool = True) -> Path:
    """``pip wheel --no-deps``; without build isolation as a second try (a machine that
    cannot reach an index may still have the build backend installed)."""
    out = root / "built"
    out.mkdir(parents=True, exist_ok=True)
    errors = []
    for isolation in ([], ["--no-build-isolation"])[0 if isolated else 1:]:
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=root) as tmp:
            command = [*_pip_command(), "wheel", "--no-deps", "--wheel-dir", tmp,
                       *isolation, requirement]
            done = _run(command, timeout=PIP_TIMEOUT,
                        env={**os.environ, "SOURCE_DATE_EPOCH": _EPOCH})
            made = sorted(Path(tmp).glob("*.whl"))
            if done.returncode == 0 and made:
                return _keep(made[0], out)
            errors.append(_last_line(done.stdout + done.stderr))
        if not isolation:
            say(f"building {requirement} with build isolation failed; trying without")
    raise WheelhouseError(f"cannot build a wheel of {requirement}: {errors[-1]}")


def _keep(path: Path, out: Path) -> Path:
    """Keep a built wheel under its hash: two builds of one version may differ."""
    digest = _sha256(path)
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
    return _repack(metadata.distribution(BURST_DIST), root)


# -- repacking what is installed here -----------------------------------------------------

_CONNECTION = re.compile(r"(NewConnectionError|Connection refused|Failed to establish a new "
                         r"connection|Name or service not known|Temporary failure in name "
                         r"resolution|Network is unreachable|No route to host|timed out|"
                         r"Max retries exceeded|Could not fetch URL)[^\n]*")
_TRUE = ("1", "true", "yes", "on")
_REPACK_FORMAT = "1"  # bump when repacked wheels change: the cache is keyed on it
_REPACK_LEVEL = 1  # zlib: 3x faster than 6 on torch's 430 MB library, 15 % larger
_INSTALLER_FILES = ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")


def _connection_line(output: str) -> str | None:
    """pip's complaint that it could not reach an index, or None."""
    match = _CONNECTION.search(output or "")
    return match.group(0).strip()[:200] if match else None


def _unreachable(text: str | None) -> bool:
    return bool(text and text.startswith("package index unreachable"))


def _as_unreachable(why: str) -> str:
    return why if _unreachable(why) else f"package index unreachable: {why}"


def _offline(say: Say) -> str | None:
    """Why pip here can reach no package index (None: it may): ``no-index`` configured, or
    every configured index refusing or not resolving. One probe instead of a timeout per
    pin; behind a proxy the probe cannot tell, and pip's own failures decide."""
    done = _run([*_pip_command(), "config", "list"], timeout=60)
    config: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        config[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")  # the last scope wins
    if config.get("find-links"):
        return None  # pip may find the pins there: its own failures decide
    if config.get("no-index", "").lower() in _TRUE:
        why = "pip is configured with no-index"
    elif config.get("proxy") or any(os.environ.get(v) for v in (
            "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")):
        return None
    else:
        urls = [config.get("index-url") or "https://pypi.org/simple",
                *config.get("extra-index-url", "").split()]
        if any(_reachable(url) for url in urls):
            return None
        why = f"no configured index answers ({', '.join(strip_url(u) for u in urls)})"
    say(f"package index unreachable ({why}): wheels come from this environment")
    return why


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(unquote(parts.path)).exists()
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return True  # not ours to judge
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=3).close()
    except OSError:
        return False
    return True


def _repack_installed(pins: list[Pin], target: Target, root: Path, paths: list[str] | None,
                      say: Say) -> dict[str, tuple[Path | None, str]]:
    """Repack the ``pins`` installed here at their version into wheels, in parallel
    (compression releases the GIL). ``{name: (wheel, "")}``, or ``(None, why)`` for one
    installed here but unfit for the node; pins not installed here are left out."""
    installed = _installed_dists(paths)
    jobs: dict[str, metadata.Distribution] = {}
    for pin in pins:
        dist = installed.get(pin.name)
        if pin.how == "download" and dist is not None and _same_version(dist.version,
                                                                         pin.version):
            jobs[pin.name] = dist
    if not jobs:
        return {}
    say(f"repacking {len(jobs)} installed distribution(s) into wheels")
    accepted = target.tags()

    def one(dist: metadata.Distribution) -> tuple[Path | None, str]:
        try:
            return _repack(dist, root, accepted), ""
        except WheelhouseError as error:
            return None, str(error)

    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return dict(zip(jobs, pool.map(one, jobs.values()), strict=True))
    except RuntimeError:  # a freeze finishing while the interpreter exits: one at a time
        return {name: one(dist) for name, dist in jobs.items()}


def _installed_dists(paths: list[str] | None) -> dict[str, metadata.Distribution]:
    """The installed (``.dist-info``) distributions, the first of each name as for import."""
    out: dict[str, metadata.Distribution] = {}
    found = metadata.distributions() if paths is None else metadata.distributions(path=paths)
    for dist in found:
        name = dist.metadata["Name"] if dist.metadata else None
        if name and lockfile.normalize(name) not in out and dist.read_text("WHEEL"):
            out[lockfile.normalize(name)] = dist
    return out


def installed_tags(dist: metadata.Distribution) -> frozenset[wheeltags.Tag]:
    """The wheel tags an installed distribution was built for (its ``WHEEL`` file)."""
    out: set[wheeltags.Tag] = set()
    for line in (dist.read_text("WHEEL") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "tag" and value.strip():
            out |= wheeltags.parse_tag(value.strip())
    return frozenset(out)


def _repack(dist: metadata.Distribution, root: Path,
            accepted: frozenset[wheeltags.Tag] | None = None) -> Path:
    """A wheel rebuilt from an installed distribution's RECORD, kept in the cache under a
    fingerprint of that RECORD (so the same install is repacked once).

    Its tags are the ``WHEEL`` file's that ``accepted`` holds (pure Python without one);
    a regenerated RECORD hashes every file with sha256. Files outside site-packages go to
    ``.data/`` (scripts, headers, data) except console scripts, which the installer
    writes again from ``entry_points.txt``; anything outside the environment is dropped."""
    name = str(dist.metadata["Name"] or "")
    tags = installed_tags(dist) or frozenset(wheeltags.parse_tag("py3-none-any"))
    fitting = tags & accepted if accepted is not None else tags
    if not fitting:
        raise WheelhouseError(f"installed {name} {dist.version} is built for "
                              f"{', '.join(sorted(map(str, tags)))}, which does not run on the "
                              f"node")
    record = dist.read_text("RECORD")
    if record is None:
        raise WheelhouseError(f"cannot repack {name}: no RECORD")
    tag = _tag_string(fitting)
    fingerprint = hashlib.sha256("\0".join([_REPACK_FORMAT, record, tag,
                                            str(_REPACK_LEVEL)]).encode()).hexdigest()[:16]
    keep = root / "repacked" / fingerprint
    ready = sorted(keep.glob("*.whl")) if keep.is_dir() else []
    if ready:
        return ready[0]
    entries = _repack_entries(dist)
    filename = f"{lockfile.normalize(name).replace('-', '_')}-" \
               f"{dist.version.replace('-', '_')}-{tag}.whl"
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="repack-", dir=root) as tmp:
        path = Path(tmp) / filename
        _write_wheel(path, entries, _info_dir(dist))
        dest = keep / filename
        os.replace(path, dest)
        return dest


def _tag_string(tags: frozenset[wheeltags.Tag]) -> str:
    """The filename form of ``tags`` (``cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64``);
    one of them when they are not a product of their parts."""
    parts = [sorted({getattr(t, a) for t in tags}) for a in ("interpreter", "abi", "platform")]
    if len(parts[0]) * len(parts[1]) * len(parts[2]) == len(tags):
        return "-".join(".".join(p) for p in parts)
    return str(min(tags, key=str))


def _info_dir(dist: metadata.Distribution) -> str:
    record = next(str(f) for f in dist.files or [] if str(f).endswith(".dist-info/RECORD"))
    return record.rsplit("/", 1)[0]


def _repack_entries(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """``(name in the wheel, file here)`` for every installed file the wheel carries."""
    info = _info_dir(dist)
    data = info[: -len(".dist-info")] + ".data"
    base = Path(str(dist.locate_file(""))).resolve()
    prefix = base.parents[2] if base.parent.parent.name == "lib" and base.name in (
        "site-packages", "dist-packages") else None
    scripts = {e.name for e in dist.entry_points
               if e.group in ("console_scripts", "gui_scripts")}
    out = []
    for f in dist.files or []:
        rel = str(f)
        if rel.endswith((".pyc", ".pyo")) or "__pycache__" in rel or rel in {
                f"{info}/{n}" for n in _INSTALLER_FILES}:
            continue
        path = Path(os.path.normpath(base / rel))
        if not path.is_file():
            continue  # removed since it was installed: the environment lacks it too
        if not rel.startswith(".."):
            out.append((rel, path))
            continue
        placed = _data_name(path, prefix, base, scripts, data, lockfile.normalize(dist.name))
        if placed:
            out.append((placed, path))
    return out


def _data_name(path: Path, prefix: Path | None, base: Path, scripts: set[str], data: str,
               name: str) -> str | None:
    """Where a file installed outside site-packages goes in the wheel (``.data/``)."""
    if prefix is None:
        return None
    try:
        rel = path.relative_to(prefix)
    except ValueError:
        return None  # outside the environment
    head = rel.parts[0]
    if head == "bin":
        return None if path.name in scripts else f"{data}/scripts/{path.name}"
    if head == "include" and len(rel.parts) > 4 and rel.parts[1] == "site" and \
            lockfile.normalize(rel.parts[3]) == name:
        return f"{data}/headers/{'/'.join(rel.parts[4:])}"
    return f"{data}/data/{rel.as_posix()}"


def _write_wheel(path: Path, entries: list[tuple[str, Path]], info: str) -> None:
    """A deterministic zip (sorted, fixed times, modes kept), ``.dist-info`` last, RECORD
    regenerated with sha256 hashes."""
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    ordered = sorted(entries, key=lambda e: (e[0].startswith(f"{info}/"), e[0]))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=_REPACK_LEVEL) as wheel:
        for name, source in ordered:
            digest, size = _zip_file(wheel, name, source)
            writer.writerow([name, f"sha256={digest}", size])
        writer.writerow([f"{info}/RECORD", "", ""])
        wheel.writestr(_zip_info(f"{info}/RECORD", 0o644), record.getvalue())


def _zip_file(wheel: zipfile.ZipFile, name: str, source: Path) -> tuple[str, int]:
    st = source.stat()
    info = _zip_info(name, st.st_mode & 0o777)
    info.file_size = st.st_size
    digest = hashlib.sha256()
    script = "/scripts/" in name and ".data/" in name
    big = st.st_size > 1 << 30
    with source.open("rb") as f, wheel.open(info, "w", force_zip64=big) as out:
        first = True
        for chunk in iter(lambda: f.read(1 << 20), b""):
            if first and script:
                chunk = _python_shebang(chunk)
            first = False
            digest.update(chunk)
            out.write(chunk)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), info.file_size


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _python_shebang(chunk: bytes) -> bytes:
    """An installed script's ``#!/this/venv/bin/python`` back to ``#!python``, which the
    installer rewrites for the node's interpreter."""
    line, sep, rest = chunk.partition(b"\n")
    if line.startswith(b"#!") and b"python" in line:
        return b"#!python" + sep + rest
    return chunk


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel(path: Path, role: str, *, repacked: bool = False) -> Wheel:
    parsed = _parse(path.name)
    name, version = (parsed[0], parsed[1]) if parsed else (path.name, "")
    return Wheel(name, version, path.name, _sha256(path), path.stat().st_size, role, path,
                 repacked)


# -- the store ----------------------------------------------------------------------------

@dataclass
class Uploaded:
    """What one upload sent: a wheel already in the store is never sent again."""

    wheels_sent: int = 0
    bytes_sent: int = 0
    wheels_present: int = 0
    index_key: str = ""
    index: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False  # upload's ``stop`` was set: wheels are missing, no index written


def upload(store: Store, run_id: str, digest: str, house: Wheelhouse, *,
           pace: Pace | None = None, stop: threading.Event | None = None,
           policy: RetryPolicy = DEFAULT_RETRY) -> Uploaded:
    """Store every wheel not yet in the store, then the lockfile's index (last: a reader
    that finds the index finds every wheel it names).

    The wheels go up several at once, each from its file on disk (multipart and parallel
    on S3/OSS: :func:`burst.store.files.upload_files`), resumably: a wheel already in the
    store is skipped, and an S3 upload a failed or killed push left open is continued.
    For the background stager (burst.env.staging): pass its throttle's ``wait`` as
    ``pace`` and its stop event as ``stop``; a stopped upload writes no index and says
    ``stopped``, and the next call sends only what is still missing. Each store call is
    retried on a transient fault through ``policy``."""
    store = retrying(store, policy)
    done = Uploaded(index_key=index_key(run_id, digest), index=house.index())
    files = []
    for wheel in house.wheels:
        if wheel.path is None:
            if store.size(wheel.key) is None:
                raise WheelhouseError(f"wheel {wheel.file} is not on this machine")
            done.wheels_present += 1
            continue
        files.append((wheel.key, wheel.path))
    sent = upload_files(store, files, pace=pace, stop=stop, policy=policy)
    done.wheels_sent, done.bytes_sent = sent.sent, sent.bytes_sent
    done.wheels_present += sent.present
    done.stopped = sent.stopped
    if not done.stopped:
        store.put(done.index_key, _dumps(done.index))
    return done


def _dumps(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()


def ensure(store: Store, run_id: str, lock: Lockfile, target: Target, *,
           cache: Path | None = None, torch_index: str | None = None,
           say: Say | None = None, paths: list[str] | None = None) -> Uploaded | None:
    """Build and upload the wheelhouse of ``lock`` unless the store already has one for
    this target; None when there was nothing to do. Its reads and writes are retried on
    a transient fault: one cut-short body must not fail a push whose snapshots landed."""
    if target.policy == "none":
        return None
    store = retrying(store)
    existing = load_index(store, run_id, lock.digest)
    if existing is not None and existing.get("target") == target.to_json() and all(
            store.size(wheel_key(w["sha256"], w["file"])) is not None
            for w in existing.get("wheels", [])):
        return None  # an index copied without its wheels (a pushed local tier) is rebuilt
    reused = _reuse(store, run_id, lock, target)
    if reused is not None:  # the same pins under another lockfile (a resumed node's)
        store.put(index_key(run_id, lock.digest), _dumps(reused))
        return Uploaded(wheels_present=len(reused["wheels"]),
                        index_key=index_key(run_id, lock.digest), index=reused)
    house = build(lock, target, cache=cache, torch_index=torch_index, say=say, paths=paths)
    return upload(store, run_id, lock.digest, house)


def _reuse(store: Store, run_id: str, lock: Lockfile, target: Target) -> dict[str, Any] | None:
    """The index of another lockfile of this run that pins exactly the same distributions,
    for the same Python, machine and policy, with every wheel in the store.

    A resumed run freezes its node's environment again: its lockfile differs (another patch
    release of Python, another host) but its pins do not, and the node must not rebuild,
    repack or upload what the store has. The index keeps its torch build: the one chosen
    for the run where it was frozen, not the node's default guess."""
    if any(not p.installable and p.name != BURST_DIST for p in lock.packages):
        return None  # local code may have changed under the same version: build it again
    pins = sorted((p.name, p.version) for p in lock.packages)
    same = {k: v for k, v in target.to_json().items() if k != "torch_variant"}
    prefix = f"{run_id}/env/wheelhouse-"
    for key in reversed(store.list(prefix)):
        digest = key[len(prefix):-len(".json")]
        if digest == lock.digest:
            continue
        try:
            index = load_index(store, run_id, digest)
            other = lockfile.load(store, run_id, digest)
        except (BurstError, KeyError):
            continue
        if index is None or sorted((p.name, p.version) for p in other.packages) != pins:
            continue
        if {k: v for k, v in index.get("target", {}).items() if k != "torch_variant"} != same:
            continue
        if all(store.size(wheel_key(w["sha256"], w["file"])) is not None
               for w in index.get("wheels", [])):
            return index
    return None


def load_index(store: Store, run_id: str, digest: str) -> dict[str, Any] | None:
    """The wheelhouse index of a run's lockfile, or None when it has none."""
    store = retrying(store)
    try:
        data = json.loads(store.get(index_key(run_id, digest)))
    except KeyError:
        return None
    except ValueError as error:
        raise WheelhouseError(f"wheelhouse index of {run_id} is not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WheelhouseError(f"wheelhouse index of {run_id} has an unknown format: upgrade "
                              f"burst")
    return data


def download(store: Store, run_id: str, digest: str, dest: Path) -> dict[str, Any]:
    """Fetch the wheelhouse of a run's lockfile into ``dest`` (hash-checked; a wheel
    already there is kept) and write its index beside them; return the index."""
    store = retrying(store)
    index = load_index(store, run_id, digest)
    if index is None:
        raise WheelhouseError(f"run {run_id!r} has no wheelhouse for lockfile {digest[:12]} "
                              f"in {store.url}: run `burst push {run_id}` (or `burst freeze`) "
                              f"where it trains")
    dest.mkdir(parents=True, exist_ok=True)
    for entry in index.get("wheels", []):
        file, sha = _safe_name(entry["file"]), entry["sha256"]
        path = dest / file
        if path.exists() and _sha256(path) == sha:
            continue
        data = store.get(wheel_key(sha, file))
        if hashlib.sha256(data).hexdigest() != sha:
            raise WheelhouseError(f"wheel {file} in {store.url} does not match its hash")
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    (dest / INDEX_FILE).write_bytes(_dumps(index))
    return index


def _safe_name(file: str) -> str:
    if "/" in file or "\\" in file or file.startswith(".") or not file.endswith(".whl"):
        raise WheelhouseError(f"refusing wheel file name {file!r}")
    return file


def read_local(directory: Path) -> dict[str, Any] | None:
    """The index of a downloaded wheelhouse directory, or None."""
    try:
        return json.loads((directory / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return None


def wheels_in(directory: Path) -> dict[str, str]:
    """``{name: version}`` of the wheels in a directory (a downloaded wheelhouse)."""
    out = {}
    for path in sorted(directory.glob("*.whl")):
        parsed = _parse(path.name)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def summary(house_or_index: Wheelhouse | dict[str, Any]) -> dict[str, Any]:
    """Counts and bytes by role, for printing."""
    index = house_or_index.index() if isinstance(house_or_index, Wheelhouse) else house_or_index
    roles: dict[str, dict[str, int]] = {}
    for w in index.get("wheels", []):
        entry = roles.setdefault(w["role"], {"wheels": 0, "bytes": 0})
        entry["wheels"] += 1
        entry["bytes"] += int(w["size"])
    return {"wheels": len(index.get("wheels", [])),
            "bytes": sum(int(w["size"]) for w in index.get("wheels", [])),
            "roles": roles, "missing": index.get("missing", []), "target": index.get("target")}


"""The frozen environment of a run: every installed distribution pinned, plus where it came
from and what machine it ran on.

A lockfile is read from the running interpreter's own metadata (``importlib.metadata``),
never by running whatever ``pip`` happens to be on PATH, which may belong to another
environment. It is canonical JSON, so the same environment always gives the same bytes and
the same SHA-256: the *lockfile hash* a snapshot manifest records. In the store it lives
content-addressed at ``<run>/env/lock-<hash>.json``, with the newest also at
``<run>/env/lockfile.json``.

Editable and local-path installs cannot be installed on another machine from a name and a
version. The lockfile marks them ``installable: false``; the project code reaches the new
node as the code archive instead (see :mod:`burst.codearchive`), and an editable install
that lies inside the archived tree says where (``in_code``).

A distribution that only some platforms need (``pywin32`` on Windows, ``nvidia-*`` on
x86_64) carries the environment marker under which the distributions that require it ask
for it (``marker``), read from their metadata; installing on another platform, and building
a wheelhouse for one, skips the entries whose marker does not hold there. Lockfiles written
before markers were recorded load as "needed everywhere".
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import metadata
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from packaging.markers import InvalidMarker, Marker, default_environment
from packaging.requirements import InvalidRequirement, Requirement

from burst.env import machine as envfacts
from burst.env import pkgindex
from burst.errors import BurstError
from burst.redact import strip_url
from burst.snapshot.format import FORMAT_VERSION
from burst.store.base import Store

LOCKFILE_VERSION = 1
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
# Distributions a torch wheel pins for its own CUDA/ROCm build: they change with the build
# variant and must not be carried over when the variant is translated for another card.
_COUPLED = re.compile(r"^(nvidia-(?!ml-py).*|triton|pytorch-triton.*|cuda-(bindings|pathfinder|"
                      r"toolkit|python)|torch-.*-cu\d+)$")


class LockfileError(BurstError):
    """A lockfile is missing, unreadable, or from an incompatible burst."""


@dataclass(frozen=True)
class Package:
    """One installed distribution, pinned."""

    name: str  # normalized (PEP 503)
    version: str
    source: str = "index"  # index | editable | local | url | vcs
    url: str | None = None  # stripped of credentials; vcs: "git+https://...@<commit>"
    installable: bool = True  # False: only this machine can install it (a local path)
    in_code: str | None = None  # editable/local dir inside the code archive: its path there
    torch_coupled: bool = False  # pinned by torch's build variant (nvidia-*, triton)
    marker: str | None = None  # PEP 508 marker it is needed under; None: everywhere

    def requirement(self) -> str:
        """The pip requirement that reinstalls exactly this distribution elsewhere."""
        if self.source in ("url", "vcs") and self.url:
            return f"{self.name} @ {self.url}"
        return f"{self.name}=={self.version}"


@dataclass
class Lockfile:
    """Everything needed to rebuild (or check) a run's environment on another machine."""

    packages: list[Package]
    python: dict[str, str] = field(default_factory=dict)
    platform: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    indexes: list[dict[str, str]] = field(default_factory=list)
    burst: dict[str, Any] = field(default_factory=dict)
    version: int = LOCKFILE_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["packages"] = [_compact(p) for p in self.packages]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lockfile:
        if not isinstance(data, dict) or data.get("version") != LOCKFILE_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise LockfileError(f"unsupported lockfile version {found!r} (this burst reads "
                                f"version {LOCKFILE_VERSION}): upgrade burst on this node")
        known = {f.name for f in fields(Package)}
        packages = [Package(**{k: v for k, v in p.items() if k in known})
                    for p in data.get("packages", [])]
        rest = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        rest["packages"] = packages
        return cls(**rest)

    def dumps(self) -> bytes:
        """Canonical bytes: sorted keys, fixed separators, so equal content hashes equal."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n").encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.dumps()).hexdigest()

    def applicable(self, environment: dict[str, str]) -> list[Package]:
        """The packages whose marker holds in ``environment`` (see :func:`node_environment`)."""
        return [p for p in self.packages if applies(p, environment)]

    def package(self, name: str) -> Package | None:
        wanted = normalize(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def torch_index_template(self) -> str | None:
        return (self.torch or {}).get("index_template")

    def torch_variant(self) -> str:
        """The torch build this lockfile recorded (``cpu``, ``cu128``, ``default``...)."""
        facts = self.torch or {}
        if facts.get("variant"):
            return str(facts["variant"])
        torch = self.package("torch")
        return envfacts.torch_variant(torch.version if torch else "", facts.get("cuda"))


def loads(data: bytes | str) -> Lockfile:
    try:
        return Lockfile.from_json(json.loads(data))
    except (ValueError, TypeError) as error:
        raise LockfileError(f"not a burst lockfile: {error}") from None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- building ----------------------------------------------------------------------------

def build(code_root: Path | None = None, *, paths: list[str] | None = None,
          with_torch: bool = True, with_gpu: bool = True) -> Lockfile:
    """Freeze the running interpreter. ``paths`` (tests) reads distributions from other
    directories; ``code_root`` is the archived project, to tie editable installs to it."""
    indexes = pkgindex.configured_indexes(project_dir=code_root)
    packages = collect_packages(paths, code_root)
    torch = envfacts.torch_facts() if with_torch else None
    if torch is not None:
        torch["index_template"] = pkgindex.torch_index_template(indexes)
    gpu = envfacts.detect_gpu() if with_gpu else None
    from burst import __version__

    return Lockfile(packages=packages, python=envfacts.python_facts(),
                    platform=envfacts.platform_facts(), torch=torch,
                    gpu=gpu.to_json() if gpu else None,
                    indexes=[i.to_json() for i in indexes],
                    burst={"version": __version__, "snapshot_format": FORMAT_VERSION})


def collect_packages(paths: list[str] | None = None,
                     code_root: Path | None = None) -> list[Package]:
    """Every distribution importable here, sorted. Where one is found twice, an installed
    one (``.dist-info``) beats a source tree's ``.egg-info`` that the current directory
    put on ``sys.path``; otherwise the first one wins, as for ``import``."""
    dists: dict[str, Installed] = {}
    found_here = metadata.distributions() if paths is None else metadata.distributions(path=paths)
    for dist in found_here:
        found = Installed.read(dist)
        if found is None:
            continue
        seen = dists.get(normalize(found.name))
        if seen is None or (not seen.installed and found.installed):
            dists[normalize(found.name)] = found
    coupled = _torch_requirements(dists.get("torch"))
    markers = required_markers(dists)
    return [replace(_package(name, found, code_root,
                             name in coupled or bool(_COUPLED.match(name))),
                    marker=markers.get(name))
            for name, found in sorted(dists.items())]


@dataclass(frozen=True)
class Installed:
    """A distribution with the metadata headers a lockfile needs, parsed once.

    ``importlib.metadata`` parses the whole METADATA file (long descriptions included)
    on every ``.metadata``, ``.version`` and ``.requires``; a freeze asked three times per
    distribution, which was most of its cost (0.3-0.6 s for 200 distributions, in the
    background thread that competes with the first training steps). Only the header
    block is parsed here, once."""

    dist: metadata.Distribution
    name: str
    version: str
    requires: list[str]
    installed: bool  # a ``.dist-info`` (METADATA), not a source tree's ``.egg-info``

    @classmethod
    def read(cls, dist: metadata.Distribution) -> Installed | None:
        wheel_metadata = dist.read_text("METADATA")
        text = wheel_metadata or dist.read_text("PKG-INFO")
        head = text.split("\n\n", 1)[0] if text else None  # the description: not needed
        headers = email.parser.HeaderParser().parsestr(head) if head else None
        if headers is None or not headers["Name"]:
            return None
        requires = headers.get_all("Requires-Dist")
        if requires is None and dist.read_text("requires.txt") is not None:
            requires = dist.requires  # an .egg-info keeps them beside PKG-INFO
        return cls(dist, str(headers["Name"]), str(headers["Version"]), list(requires or []),
                   installed=wheel_metadata is not None)


def _requirement_name(text: str) -> str:
    """The normalized name a ``Requires-Dist`` line starts with (without parsing it)."""
    return normalize(re.split(r"[\s;<>=!~\[(@]", text, maxsplit=1)[0])


def _torch_requirements(torch: Installed | None) -> set[str]:
    """Names torch's own metadata pins for its build (``nvidia-cublas-cu12`` ...)."""
    coupled = set()
    for requirement in torch.requires if torch else []:
        name = _requirement_name(requirement)
        if _COUPLED.match(name):
            coupled.add(name)
    return coupled


def _package(name: str, found: Installed, code_root: Path | None, coupled: bool) -> Package:
    version, dist = found.version, found.dist
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if not isinstance(direct, dict) or not isinstance(direct.get("url"), str):
        return Package(name, version, torch_coupled=coupled)
    url = direct["url"]
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        commit = vcs.get("commit_id", "")
        return Package(name, version, "vcs", f"{vcs.get('vcs', 'git')}+{strip_url(url)}@{commit}")
    if url.startswith("file:"):
        editable = bool(direct.get("dir_info", {}).get("editable"))
        path = Path(unquote(urlsplit(url).path))
        return Package(name, version, "editable" if editable else "local", url=path.as_posix(),
                       installable=False, in_code=_inside(path, code_root))
    return Package(name, version, "url", strip_url(url), torch_coupled=coupled)


def _inside(path: Path, root: Path | None) -> str | None:
    if root is None:
        return None
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


# -- markers -----------------------------------------------------------------------------

_MAX_MARKER = 1000  # a marker longer than this is dropped (needed everywhere): safe, readable


def required_markers(dists: dict[str, Installed]) -> dict[str, str]:
    """For each distribution that only conditional requirements pull in, the marker under
    which it is needed: its requirers' ``Requires-Dist`` markers, each joined with the
    requirer's own marker. A distribution something needs unconditionally, one the user
    asked for (pip's ``REQUESTED``), or one whose marker does not even hold on this machine
    (then it was installed for another reason) gets none."""
    edges: dict[str, list[tuple[str, str | None]]] = {}
    for name in sorted(dists):
        for text in dists[name].requires:
            if _requirement_name(text) not in dists:  # an extra's, not installed: no parse
                continue
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            needed = normalize(requirement.name)
            if needed in dists and needed != name:
                marker = _without_extras(str(requirement.marker)) if requirement.marker else None
                edges.setdefault(needed, []).append((name, marker))
    here = cast("dict[str, str]", dict(default_environment()))  # a TypedDict of strings
    out: dict[str, str] = {}
    memo: dict[str, str | None] = {}
    for name in sorted(dists):
        marker = _marker_of(name, edges, dists, memo, frozenset())
        if marker is not None and _holds(marker, here) and not _everywhere(marker):
            out[name] = marker
    return out


_SAMPLES = [(python, machine, system) for python in ("3.8", "3.10", "3.13")
            for machine, system in (("x86_64", "Linux"), ("aarch64", "Linux"),
                                    ("AMD64", "Windows"), ("arm64", "Darwin"))]


def _everywhere(marker: str) -> bool:
    """A marker that holds on every platform burst knows says nothing: dropped."""
    return all(_holds(marker, node_environment(*sample)) for sample in _SAMPLES)


def _marker_of(name: str, edges: dict[str, list[tuple[str, str | None]]],
               dists: dict[str, Installed], memo: dict[str, str | None],
               stack: frozenset[str]) -> str | None:
    if name in memo:
        return memo[name]
    if name not in edges or name in stack or _requested(dists[name].dist):
        return None  # top level, asked for, or a cycle: needed everywhere
    alternatives: list[str] = []
    for parent, edge in edges[name]:
        above = _marker_of(parent, edges, dists, memo, stack | {name})
        if above is None and edge is None:
            alternatives = []
            break
        alternatives.append(_join(" and ", [m for m in (above, edge) if m]))
    marker = _join(" or ", list(dict.fromkeys(alternatives))) if alternatives else None
    if marker is not None and len(marker) > _MAX_MARKER:
        marker = None
    memo[name] = marker
    return marker


def _join(op: str, markers: list[str]) -> str:
    if len(markers) == 1:
        return markers[0]
    return op.join(f"({m})" for m in markers)


def _requested(dist: metadata.Distribution) -> bool:
    try:
        return dist.read_text("REQUESTED") is not None
    except OSError:
        return False


_EXTRA = re.compile(r"""extra\s*[!=]=\s*(['"])[^'"]*\1|(['"])[^'"]*\2\s*[!=]=\s*extra""")
_PLATFORM_VARIABLE = re.compile(r"\b(python_(full_)?version|os_name|sys_platform|platform_\w+|"
                                r"implementation_\w+)\b")
_TRUE = 'python_version >= "0"'  # a clause that always holds: stands in for an extra


def _without_extras(marker: str) -> str | None:
    """``extra == "x"`` clauses hold: the requirer is installed, so with the extras that
    pulled the package in. What is left is the platform part, or None when nothing is."""
    if not _PLATFORM_VARIABLE.search(_EXTRA.sub("", marker)):
        return None
    return _EXTRA.sub(_TRUE, marker)


def _holds(marker: str, environment: dict[str, str]) -> bool:
    try:
        return bool(Marker(marker).evaluate({**environment, "extra": ""}))
    except (InvalidMarker, ValueError, KeyError):
        return True  # unreadable: install it, as before markers were recorded


def applies(package: Package, environment: dict[str, str]) -> bool:
    """Whether ``package`` is needed on the platform ``environment`` describes."""
    return package.marker is None or _holds(package.marker, environment)


def node_environment(python: str, machine: str = "x86_64", system: str = "Linux"
                     ) -> dict[str, str]:
    """Marker variables of a CPython ``python`` (``3.11`` or ``3.11.7``) node: what the
    wheelhouse and the install evaluate markers against."""
    parts = [*python.split("."), "0", "0"][:3]
    full = ".".join(parts)
    sys_platform = {"Linux": "linux", "Windows": "win32", "Darwin": "darwin"}.get(system,
                                                                                  system.lower())
    return {"implementation_name": "cpython", "implementation_version": full,
            "os_name": "nt" if system == "Windows" else "posix",
            "platform_machine": machine, "platform_release": "", "platform_system": system,
            "platform_version": "", "python_full_version": full,
            "platform_python_implementation": "CPython",
            "python_version": ".".join(parts[:2]), "sys_platform": sys_platform, "extra": ""}


def _compact(package: Package) -> dict[str, Any]:
    """Only the fields that differ from the defaults: keeps a lockfile readable."""
    defaults = Package("", "")
    data = {"name": package.name, "version": package.version}
    for f in fields(Package):
        value = getattr(package, f.name)
        if f.name not in data and value != getattr(defaults, f.name):
            data[f.name] = value
    return data


def requirements(packages: Iterable[Package]) -> list[str]:
    return [p.requirement() for p in packages if p.installable]


# -- the store ---------------------------------------------------------------------------

def key(run_id: str, digest: str) -> str:
    return f"{run_id}/env/lock-{digest}.json"


def latest_key(run_id: str) -> str:
    return f"{run_id}/env/lockfile.json"


def save(store: Store, run_id: str, lock: Lockfile) -> str:
    """Store the lockfile under its hash (once) and as the run's newest; return the hash."""
    data, digest = lock.dumps(), lock.digest
    if store.size(key(run_id, digest)) is None:
        store.put_if_absent(key(run_id, digest), data)
    store.put(latest_key(run_id), data)
    return digest


def load(store: Store, run_id: str, digest: str | None = None) -> Lockfile:
    """The lockfile ``digest`` of a run (checked against its hash), or the newest one."""
    name = key(run_id, digest) if digest else latest_key(run_id)
    try:
        data = store.get(name)
    except KeyError:
        raise LockfileError(f"run {run_id!r} has no frozen environment in {store.url} "
                            f"(missing {name}): run `burst freeze {run_id}` where it trains"
                            ) from None
    if digest and hashlib.sha256(data).hexdigest() != digest:
        raise LockfileError(f"lockfile {name} does not match its hash: the store is corrupt")
    return loads(data)

"""Rebuilding a run's environment on a new node from its lockfile.

Two steps, kept apart so the first can be tested and printed (``--dry-run``) without
installing anything: :func:`make_plan` turns a lockfile and a target node into the exact
requirements and installer commands (pure), and :func:`execute` runs them.

The plan pins every portable distribution with ``==``. torch, torchvision and torchaudio are
re-tagged for the build the node's card needs (:mod:`burst.torchvariant`), and the CUDA
libraries the old build pinned (``nvidia-*``, ``triton``) are left for the new build to
choose. Editable and local installs are not portable: the project arrives as the code
archive, and an editable install that lives inside it is installed from there.

A downloaded wheelhouse (:mod:`burst.env.wheelhouse`) comes first: what it holds is
installed with ``--no-index --find-links``, and only what it lacks goes to an index. Entries
whose environment marker does not hold on this node are skipped, and what the environment
already has at the pinned version (torch that the bootstrap installed) is not installed again.

Indexes: ``--index-url`` wins, then the mirror the task forwards (``$BURST_INDEX_URL``,
``$BURST_EXTRA_INDEX_URL``); otherwise a node that has its own index configured keeps it
(its credentials stay its own); otherwise the mirror recorded at freeze time is used. uv is
used when it is on PATH, pip otherwise.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from burst.contract import ENV_EXTRA_INDEX_URL, ENV_INDEX_URL, ENV_TORCH_INDEX
from burst.env import lockfile as lockfiles
from burst.env import machine as envfacts
from burst.env import pkgindex, torchvariant, wheelhouse, wheelprobe
from burst.env.check import live_in
from burst.env.lockfile import TORCH_FAMILY, Lockfile, Package
from burst.errors import BurstError, ConfigError


class InstallError(BurstError):
    """The installer failed; its own output above says why."""


@dataclass
class Options:
    """What the user asked for on the command line."""

    venv: Path | None = Path(".venv")  # None: install into the running interpreter
    installer: str = "auto"  # auto | uv | pip
    base_python: str | None = None
    index_url: str | None = None
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False
    torch_index: str | None = None  # a template with {variant}
    wheelhouse: Path | None = None  # a downloaded wheelhouse: installed from first


@dataclass
class Plan:
    installer: str
    python: str  # the interpreter that will hold the environment
    create: list[str] | None  # the command creating the venv, if it must be created
    requirements: list[str]
    index_args: list[str]
    torch: dict[str, Any] | None
    skipped: list[dict[str, str]]
    editable: list[str]  # paths, relative to the code directory, to install with -e
    notes: list[str]
    wheelhouse: str | None = None
    from_wheelhouse: list[str] = field(default_factory=list)  # installed offline from it
    present: list[str] = field(default_factory=list)  # already installed at the pin
    constraints: list[str] = field(default_factory=list)  # every pin, for the index pass

    def install_command(self, requirements_file: str, constraints_file: str | None = None
                        ) -> list[str]:
        """The index pass: what the wheelhouse (if any) lacks, pinned by the whole lock."""
        extra = ["--find-links", self.wheelhouse] if self.wheelhouse else []
        if constraints_file:
            extra += ["-c", constraints_file]
        return [*self._installer(), "-r", requirements_file, *self.index_args, *extra]

    def wheelhouse_command(self, requirements_file: str) -> list[str]:
        """The offline pass: every pin the wheelhouse holds, no index asked."""
        return [*self._installer(), "-r", requirements_file, "--no-index", "--find-links",
                str(self.wheelhouse)]

    def _installer(self) -> list[str]:
        if self.installer == "uv":
            return ["uv", "pip", "install", "--python", self.python]
        return [*_pip(self.python), "install"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def detect_target(*, gpu: str | None = None, capability: str | None = None,
                  cuda: str | None = None, cpu: bool = False, rocm: bool = False
                  ) -> torchvariant.Target:
    """The node to install for: from flags first, else from NVML. A node with an NVIDIA
    device that NVML cannot read is an error, never a silent CPU install."""
    forced = _version(cuda, "--cuda") if cuda else None
    if cpu:
        return torchvariant.Target("cpu")
    if rocm:
        return torchvariant.Target("rocm")
    if gpu or capability:
        cap = _version(capability, "--compute-capability") if capability else None
        return torchvariant.Target("cuda", gpu, cap or torchvariant.capability_of(gpu or ""),
                                   None, forced)
    found = envfacts.detect_gpu()
    if found is not None:
        cap = (_version(found.compute_capability, "compute capability")
               if found.compute_capability else torchvariant.capability_of(found.name))
        driver = _version(found.driver_cuda, "driver CUDA") if found.driver_cuda else None
        return torchvariant.Target("cuda", found.name, cap, driver, forced)
    if forced:
        return torchvariant.Target("cuda", cuda=forced)
    if envfacts.nvidia_device_present():
        raise ConfigError("this node has an NVIDIA GPU but NVML cannot read it (no driver "
                          "loaded, nvidia-smi fails): install the driver, or give --gpu NAME, "
                          "--cuda X.Y or --cpu; burst will not install a CPU build here")
    if Path("/dev/kfd").exists():
        return torchvariant.Target("rocm")
    return torchvariant.Target("none")


def _version(text: str, what: str) -> tuple[int, int]:
    parts = envfacts.parse_version(text)
    if len(parts) < 2:
        raise ConfigError(f"{what} must look like 12.8, got {text!r}")
    return parts[0], parts[1]


def make_plan(lock: Lockfile, target: torchvariant.Target, options: Options,
              environ: dict[str, str] | None = None) -> Plan:
    """The requirements and commands that rebuild ``lock`` on ``target``."""
    env = dict(os.environ if environ is None else environ)
    installer = _installer(options.installer)
    python, create = _interpreter(lock, options, installer)
    torch_plan, requirements, skipped, editable = _requirements(lock, target, options, env)
    index_args, notes = _index_args(lock, options, installer, torch_plan, env)
    if torch_plan:
        notes.insert(0, f"torch build {torch_plan['recorded']} -> {torch_plan['variant']}: "
                        f"{torch_plan['reason']}")
    plan = Plan(installer, python, create, requirements, index_args, torch_plan, skipped,
                editable, notes)
    if create is None and options.venv is not None:
        _drop_present(plan)
    if options.wheelhouse is not None:
        _use_wheelhouse(plan, lock, options.wheelhouse)
    return plan


def _drop_present(plan: Plan) -> None:
    """What the environment already has at the pinned version is not installed again
    (above all torch: the bootstrap put the card's build there from the wheelhouse)."""
    try:
        installed = live_in(plan.python).packages
    except BurstError:
        return
    present, plan.requirements = _split_pinned(plan.requirements, installed)
    plan.present.extend(present)


def _split_pinned(requirements: list[str], versions: dict[str, str]
                  ) -> tuple[list[str], list[str]]:
    """(``name==version`` requirements whose exact version ``versions`` has, the rest)."""
    matched: list[str] = []
    rest: list[str] = []
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        has = bool(version) and versions.get(lockfiles.normalize(name)) == version
        (matched if has else rest).append(requirement)
    return matched, rest


def _use_wheelhouse(plan: Plan, lock: Lockfile, directory: Path) -> None:
    """Split the requirements: those the wheelhouse holds go to the offline pass; an
    editable project it holds a wheel of is installed from that wheel."""
    held = wheelhouse.wheels_in(directory)
    plan.wheelhouse = str(directory.absolute())
    held_here, rest = _split_pinned(plan.requirements, held)
    plan.from_wheelhouse.extend(held_here)
    for package in lock.packages:
        if not package.installable and package.name in held:
            plan.from_wheelhouse.append(f"{package.name}=={held[package.name]}")
            if package.in_code in plan.editable:
                plan.editable.remove(package.in_code)
    plan.requirements = rest
    plan.constraints = [r for r in plan.from_wheelhouse + plan.present + rest if "==" in r]
    plan.notes.append(f"wheelhouse {directory}: {len(plan.from_wheelhouse)} pinned "
                      f"distributions from it, {len(rest)} from an index")


def _installer(choice: str) -> str:
    if choice == "auto":
        return "uv" if shutil.which("uv") else "pip"
    if choice == "uv" and not shutil.which("uv"):
        raise ConfigError("--installer uv: uv is not on PATH (pip install uv, or use pip)")
    return choice


def _interpreter(lock: Lockfile, options: Options, installer: str
                 ) -> tuple[str, list[str] | None]:
    """The environment's interpreter, and the command that creates it when missing."""
    if options.venv is None:
        return sys.executable, None
    venv = options.venv.expanduser().absolute()
    python = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    if Path(python).exists():
        return python, None
    wanted = ".".join(lock.python.get("version", "").split(".")[:2])
    if installer == "uv":
        return python, ["uv", "venv", str(venv), "--python", options.base_python or wanted]
    base = options.base_python or _base_python(wanted)
    pip_args = ["--without-pip"] if _pip_can_target() else []
    return python, [base, "-m", "venv", *pip_args, str(venv)]


def _base_python(wanted: str) -> str:
    here = ".".join(map(str, sys.version_info[:2]))
    if not wanted or wanted == here:
        return sys.executable
    found = shutil.which(f"python{wanted}")
    if not found:
        raise ConfigError(f"the run's environment is Python {wanted} and this node runs "
                          f"{here} with no python{wanted} on PATH: install it, install uv "
                          f"(it fetches Python), or give --base-python")
    return found


def _pip_can_target() -> bool:
    """pip >= 22.3 installs into another interpreter (``--python``): no pip in the venv
    needed, which saves seconds per environment."""
    try:
        return envfacts.parse_version(metadata.version("pip"))[:2] >= (22, 3)
    except metadata.PackageNotFoundError:
        return False


def _pip(python: str) -> list[str]:
    same_env = Path(python).absolute().parent == Path(sys.executable).absolute().parent
    if not same_env and _pip_can_target():
        return [sys.executable, "-m", "pip", "--python", python]
    return [python, "-m", "pip"]


# -- requirements ------------------------------------------------------------------------

def _requirements(lock: Lockfile, target: torchvariant.Target, options: Options,
                  env: dict[str, str]) -> tuple[dict | None, list[str], list[dict], list[str]]:
    torch = lock.package("torch")
    recorded = lock.torch_variant()
    template = options.torch_index or env.get(ENV_TORCH_INDEX) or (
        lock.torch_index_template() or pkgindex.DEFAULT_TORCH_INDEX)
    python = ".".join((lock.python.get("version", "") or _here_python()).split(".")[:2])
    # a release after the table's end is confirmed in the wheelhouse or the index, never assumed
    choice = torchvariant.choose(torch.version, recorded, target, wheelprobe.for_release(
        torch.version, template, python, options.wheelhouse)) if torch else None
    changed = bool(choice and choice.variant != recorded)
    requirements, skipped, editable = [], [], []
    here = lockfiles.node_environment(lock.python.get("version", "") or _here_python(),
                                      platform.machine(), platform.system())
    for package in lock.packages:
        if not lockfiles.applies(package, here):
            skipped.append({"name": package.name,
                            "reason": f"not needed here (marker {package.marker})"})
        elif not package.installable:
            skipped.append({"name": package.name, "reason": _why_not(package)})
            if package.source == "editable" and package.in_code is not None:
                editable.append(package.in_code)
        elif package.torch_coupled and changed:
            skipped.append({"name": package.name, "reason": "chosen by the new torch build"})
        elif package.name in TORCH_FAMILY and choice and (changed or "+" in package.version):
            retagged = torchvariant.retag(package.version, choice.variant)
            requirements.append(f"{package.name}=={retagged}")
        else:
            requirements.append(package.requirement())
    torch_plan = None
    if torch and choice:
        needs_index = changed or "+" in torch.version
        torch_plan = {"recorded": recorded, "variant": choice.variant, "reason": choice.reason,
                      "index": torchvariant.index_url(choice.variant, template)
                      if needs_index else None}
    return torch_plan, requirements, skipped, editable


def _here_python() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def _why_not(package: Package) -> str:
    where = (f"installed from the code archive ({package.in_code})" if package.in_code is not None
             and package.source == "editable" else "not portable")
    return f"{package.source} install on the source machine: {where}"


# -- indexes -----------------------------------------------------------------------------

def _index_args(lock: Lockfile, options: Options, installer: str, torch_plan: dict | None,
                env: dict[str, str]) -> tuple[list[str], list[str]]:
    args: list[str] = []
    notes: list[str] = []
    if options.no_index:
        args.append("--no-index")
    for link in options.find_links:
        args += ["--find-links", link]
    primary = _primary(lock, options, env, notes)
    if primary:
        args += ["--index-url", primary]
    extras = [i["url"] for i in lock.indexes if i.get("role") == "extra-index"
              and pkgindex.is_remote(i["url"]) and "{variant}" not in i["url"]
              and not pkgindex.torch_index_template([pkgindex.Index(i["url"], "x", "")])]
    extras = env.get(ENV_EXTRA_INDEX_URL, "").split() + extras
    if torch_plan and torch_plan.get("index"):
        extras.insert(0, torch_plan["index"])
    for url in dict.fromkeys(extras):
        args += ["--extra-index-url", url]
    if installer == "uv" and (primary or extras):
        args += ["--index-strategy", "unsafe-best-match"]  # pins decide, not index order
    return args, notes


def _primary(lock: Lockfile, options: Options, env: dict[str, str], notes: list[str]
             ) -> str | None:
    if options.index_url:
        return options.index_url
    if env.get(ENV_INDEX_URL):  # a mirror the task forwards: for what the wheelhouse lacks
        notes.append(f"the forwarded mirror ${ENV_INDEX_URL} is used")
        return env[ENV_INDEX_URL]
    own = pkgindex.primary_index(pkgindex.configured_indexes(env))
    if own:
        notes.append(f"this node's own index is used: {own}")
        return None
    recorded = pkgindex.primary_index([pkgindex.Index(i["url"], i["role"], i.get("origin", ""))
                                       for i in lock.indexes])
    if recorded and pkgindex.is_remote(recorded):
        notes.append(f"the index recorded at freeze time is used: {recorded}")
        return recorded
    return None


# -- running it --------------------------------------------------------------------------

def execute(plan: Plan, *, echo: Any = print) -> None:
    """Create the environment (if missing) and install the plan's requirements into it."""
    if plan.create:
        echo("$ " + " ".join(plan.create))
        _run(plan.create, "creating the environment")
    if plan.present:
        echo(f"already installed at the pinned version: {', '.join(plan.present)}")
    if not plan.requirements and not plan.from_wheelhouse:
        echo("nothing to install: the lockfile pins no portable distribution")
        return
    with tempfile.TemporaryDirectory(prefix="burst-env-") as tmp:
        if plan.requirements:  # first: what the wheelhouse lacks may be needed by the rest
            constraints = _write(Path(tmp) / "constraints.txt", plan.constraints)
            command = plan.install_command(_write(Path(tmp) / "requirements.txt",
                                                  plan.requirements),
                                           constraints if plan.constraints else None)
            echo("$ " + " ".join(command))
            _run(command, f"installing {len(plan.requirements)} pinned distributions"
                          + (" the wheelhouse lacks" if plan.wheelhouse else ""))
        if plan.from_wheelhouse:
            command = plan.wheelhouse_command(_write(Path(tmp) / "wheelhouse.txt",
                                                     plan.from_wheelhouse))
            echo("$ " + " ".join(command))
            _run(command, f"installing {len(plan.from_wheelhouse)} pinned distributions from "
                          f"the wheelhouse")


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def install_editable(plan: Plan, code_dir: Path, *, echo: Any = print) -> list[str]:
    """Install the editable projects found in the restored code; return the failures
    (a warning, not an error: the code itself is in place and importable from its dir)."""
    failed = []
    for rel in plan.editable:
        path = str((code_dir / rel).resolve())
        if plan.installer == "uv":
            command = ["uv", "pip", "install", "--python", plan.python, "--no-deps", "-e", path,
                       *plan.index_args]
        else:
            command = [*_pip(plan.python), "install", "--no-deps", "-e", path, *plan.index_args]
        echo("$ " + " ".join(command))
        try:
            _run(command, f"installing {rel} in editable mode")
        except InstallError as error:
            failed.append(str(error))
    return failed


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, check=False, stdout=sys.stderr.fileno()
                              if _has_fileno(sys.stderr) else None)
    except OSError as error:
        raise InstallError(f"{what} failed: cannot run {command[0]}: {error}") from None
    if done.returncode != 0:
        raise InstallError(f"{what} failed (exit {done.returncode}): see the installer's "
                           f"output above")


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True

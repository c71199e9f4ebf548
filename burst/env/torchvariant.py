"""Which torch build a card needs: the table that translates a lockfile's torch to a node.

A lockfile frozen on a laptop says ``torch==2.8.0+cpu``; the node it resumes on has an H100.
Installing the CPU build there would "work" and train on the CPU at a hundredth of the
speed, so a GPU node always gets a CUDA build: the recorded one when it supports the card,
otherwise the newest one PyTorch publishes for that torch release that the card and the
driver can run. Everything here is data (three tables) and one pure function over them.

Sources: PyTorch's release matrix (RELEASE.md, "PyTorch CUDA support matrix") and the
release notes: CUDA 12.8/12.9 builds dropped Maxwell/Pascal in 2.8 and Volta in 2.11;
Blackwell needs CUDA 12.8 or newer. Hopper runs on cu118 builds, but burst asks for 12.x:
the 11.8 builds lack Hopper's FP8 and fast attention kernels.

The table ends somewhere (``RELEASES``); a torch release after its end is planned with the
newest row, which is a guess. So a caller that can reach a package index or the store's
wheelhouse passes a ``probe`` (:mod:`burst.env.wheelprobe`): each build is confirmed to
exist there before it is chosen, best first, and a build the index does not have is never
committed to. A probe that cannot tell (index unreachable) leaves the table's choice,
and the reason says it is unconfirmed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from burst.env.machine import parse_version
from burst.errors import ConfigError

Version = tuple[int, int]
# (torch version, build variant) -> True: published; False: not there; None: cannot tell
Probe = Callable[[str, str], bool | None]


@dataclass(frozen=True)
class Family:
    """A card family: its compute capability and the oldest CUDA burst installs for it."""

    name: str
    capability: Version
    min_cuda: Version
    pattern: str  # regex over the card name, word-bounded so "A10" is not "A100"


FAMILIES: tuple[Family, ...] = (
    Family("Blackwell Ultra", (10, 3), (12, 9), r"\bG?B300\b"),
    Family("Blackwell", (10, 0), (12, 8), r"\bG?B(100|200)\b"),
    Family("Blackwell (workstation)", (12, 0), (12, 8),
           r"\bRTX (PRO )?(50[5-9]0|[2-6]000 Blackwell)|RTX PRO \d+\b"),
    Family("Hopper", (9, 0), (12, 1), r"\b(G?H100|H200|H800|H20|GH200)\b"),
    Family("Ada", (8, 9), (11, 8), r"\b(L4|L20|L40S?|RTX 40[5-9]0|RTX [2-6]000 Ada)\b"),
    Family("Ampere", (8, 0), (11, 0), r"\b(A100|A800|A30)\b"),
    Family("Ampere (GA10x)", (8, 6), (11, 1),
           r"\b(A10G?|A16|A2|A40|RTX A[2-6]000|RTX 30[5-9]0( Ti)?)\b"),
    Family("Turing", (7, 5), (10, 0), r"\b(T4|RTX 20[6-8]0|Quadro RTX|TITAN RTX)\b"),
    Family("Volta", (7, 0), (9, 0), r"\b(V100|TITAN V)\b"),
    Family("Pascal", (6, 0), (8, 0), r"\bP100\b"),
    Family("Pascal (GP10x)", (6, 1), (8, 0), r"\b(P40|P4|GTX 10[5-8]0)\b"),
)

_LEGACY = ((5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0))
_BLACKWELL = ((10, 0), (12, 0))
# torch minor release -> the CUDA builds PyTorch publishes for it -> the SASS architectures
# each one carries. A card runs a build that carries its major with a minor <= its own.
RELEASES: dict[Version, dict[str, tuple[Version, ...]]] = {
    (2, 4): {"cu118": _LEGACY, "cu121": _LEGACY, "cu124": _LEGACY},
    (2, 5): {"cu118": _LEGACY, "cu121": _LEGACY, "cu124": _LEGACY},
    (2, 6): {"cu118": _LEGACY, "cu124": _LEGACY, "cu126": _LEGACY},
    (2, 7): {"cu118": _LEGACY, "cu126": _LEGACY, "cu128": _LEGACY + _BLACKWELL},
    (2, 8): {"cu126": _LEGACY, "cu128": _LEGACY[2:] + _BLACKWELL,
             "cu129": _LEGACY[2:] + _BLACKWELL},
    (2, 9): {"cu126": _LEGACY, "cu128": _LEGACY[2:] + _BLACKWELL,
             "cu130": _LEGACY[3:] + _BLACKWELL},
    (2, 10): {"cu126": _LEGACY, "cu128": _LEGACY[2:] + _BLACKWELL,
              "cu130": _LEGACY[3:] + _BLACKWELL},
    (2, 11): {"cu126": _LEGACY, "cu128": _LEGACY[3:] + _BLACKWELL,
              "cu130": _LEGACY[3:] + _BLACKWELL},
}
ROCM: dict[Version, str] = {(2, 4): "rocm6.1", (2, 5): "rocm6.2", (2, 6): "rocm6.2.4",
                            (2, 7): "rocm6.3", (2, 8): "rocm6.4", (2, 9): "rocm6.4"}


@dataclass(frozen=True)
class Target:
    """The node to install on. ``kind``: cuda, rocm, cpu (asked for), or none (no GPU)."""

    kind: str
    name: str | None = None
    capability: Version | None = None
    driver_cuda: Version | None = None
    cuda: Version | None = None  # a CUDA build forced by the user


@dataclass(frozen=True)
class Choice:
    variant: str
    reason: str


def family_of(name: str) -> Family | None:
    for family in FAMILIES:
        if re.search(family.pattern, name, flags=re.IGNORECASE):
            return family
    return None


def capability_of(name: str) -> Version | None:
    family = family_of(name)
    return family.capability if family else None


def min_cuda(capability: Version) -> Version:
    """The oldest CUDA burst installs for a compute capability (newer unknown cards: 12.8)."""
    known = {f.capability: f.min_cuda for f in FAMILIES}
    if capability in known:
        return known[capability]
    return (12, 8) if capability >= (10, 0) else (10, 0)


def release(torch_version: str) -> dict[str, tuple[Version, ...]]:
    """The CUDA builds of a torch release; a release newer than the table gets the newest
    row (PyTorch keeps its matrix for a while), an older one the oldest."""
    minor = parse_version(torch_version)[:2]
    if minor in RELEASES:
        return RELEASES[minor]
    return RELEASES[max(RELEASES)] if minor > max(RELEASES) else RELEASES[min(RELEASES)]


def cuda_of(variant: str) -> Version | None:
    match = re.fullmatch(r"cu(\d+)(\d)", variant)
    return (int(match.group(1)), int(match.group(2))) if match else None


def runs_on(archs: tuple[Version, ...], capability: Version) -> bool:
    return any(a[0] == capability[0] and a[1] <= capability[1] for a in archs)


def in_table(torch_version: str) -> bool:
    """Whether the table has a row for this torch release (else the newest row is a guess)."""
    return parse_version(torch_version)[:2] in RELEASES


def choose(torch_version: str, recorded: str, target: Target, probe: Probe | None = None
           ) -> Choice:
    """The torch build variant to install on ``target`` for a lockfile's torch.

    With ``probe``, every CUDA build is confirmed published before it is chosen (best
    first); a release after the table's end is never assumed to match the newest row.
    """
    if target.kind == "cpu":
        return Choice("cpu", "a CPU build was asked for")
    if target.kind == "none":
        return Choice(recorded, "no GPU on this node: the recorded build is kept")
    if target.kind == "rocm":
        return _choose_rocm(torch_version, recorded)
    builds = release(torch_version)
    if target.cuda is not None:
        ranked = [_forced(torch_version, builds, target.cuda)]
    else:
        ranked = _ranked_cuda(torch_version, recorded, builds, target)
    return _confirmed(torch_version, ranked, probe)


def _confirmed(torch_version: str, ranked: list[Choice], probe: Probe | None) -> Choice:
    """The first of ``ranked`` the probe finds; the table's first when it cannot tell."""
    guess = "" if in_table(torch_version) else (
        f" (torch {torch_version} is newer than burst's table: assumed to match torch "
        f"{'.'.join(map(str, max(RELEASES)))}'s builds)")
    if probe is None:
        return replace(ranked[0], reason=ranked[0].reason + guess)
    missing: list[str] = []
    unknown: list[str] = []
    for choice in ranked:
        found = probe(torch_version, choice.variant)
        if found:
            return replace(choice, reason=f"{choice.reason}; torch {torch_version}+"
                                          f"{choice.variant} is published")
        (unknown if found is None else missing).append(choice.variant)
    if unknown:
        first = next(c for c in ranked if c.variant in unknown)
        return replace(first, reason=f"{first.reason}{guess}; unconfirmed: the index could "
                                     "not be asked" + (f" ({', '.join(missing)} not published)"
                                                       if missing else ""))
    raise ConfigError(f"torch {torch_version} has no published {' / '.join(missing)} build "
                      "(checked the package index and wheelhouse): pin a torch release "
                      "that has one, or give --cuda X.Y for a build that exists")


def _forced(torch_version: str, builds: dict, cuda: Version) -> Choice:
    variant = f"cu{cuda[0]}{cuda[1]}"
    if variant not in builds and in_table(torch_version):
        raise ConfigError(f"torch {torch_version} has no {variant} build; it has "
                          f"{', '.join(builds)}")
    return Choice(variant, f"CUDA {cuda[0]}.{cuda[1]} was asked for")


def _ranked_cuda(torch_version: str, recorded: str, builds: dict, target: Target
                 ) -> list[Choice]:
    """Every build that serves the card, best first (the recorded one if it serves)."""
    capability = target.capability
    if capability is None:
        raise ConfigError(f"cannot tell which CUDA build {target.name or 'this GPU'} needs: "
                          f"give --compute-capability X.Y or --cuda X.Y")
    floor = min_cuda(capability)
    fits = [v for v, archs in builds.items()
            if runs_on(archs, capability) and (cuda_of(v) or (0, 0)) >= floor]
    newest_first = sorted(fits, key=lambda v: cuda_of(v) or (0, 0), reverse=True)
    if target.driver_cuda is not None:
        fits = [v for v in newest_first if (cuda_of(v) or (0, 0))[0] <= target.driver_cuda[0]]
        # same-major builds newer than the driver run (minor version compatibility), but
        # one the driver fully supports is preferred, else the one closest to the driver
        within = [v for v in fits if (cuda_of(v) or (0, 0)) <= target.driver_cuda]
        fits = within + sorted(set(fits) - set(within), key=lambda v: cuda_of(v) or (0, 0))
    else:  # driver unknown: CUDA 12 builds run on every driver since 525, CUDA 13 needs 580
        fits = [v for v in newest_first if (cuda_of(v) or (0, 0))[0] <= 12] or newest_first
    card = f"{target.name or 'the GPU'} (sm_{capability[0]}{capability[1]})"
    if not fits:
        raise ConfigError(f"torch {torch_version} has no CUDA build for {card} with CUDA >= "
                          f"{floor[0]}.{floor[1]}{_driver_note(target)}: upgrade torch in "
                          f"the run's environment, or give --cuda X.Y to override")
    ranked = [Choice(v, f"{recorded} cannot serve {card}; {v} is the newest build that "
                        f"can{_driver_note(target)}") for v in fits]
    if recorded in fits:
        ranked = [Choice(recorded, f"the recorded {recorded} build runs on {card}"),
                  *(c for c in ranked if c.variant != recorded)]
    return ranked


def _driver_note(target: Target) -> str:
    if target.driver_cuda is None:
        return ""
    return f" under a driver for CUDA {target.driver_cuda[0]}.{target.driver_cuda[1]}"


def _choose_rocm(torch_version: str, recorded: str) -> Choice:
    if recorded.startswith("rocm"):
        return Choice(recorded, "the recorded ROCm build is kept")
    minor = parse_version(torch_version)[:2]
    variant = ROCM[minor] if minor in ROCM else ROCM[max(ROCM)]
    return Choice(variant, f"an AMD GPU needs a ROCm build: {variant}")


def index_url(variant: str, template: str) -> str | None:
    """The wheel index for a variant (``default`` is PyPI's own build: no extra index)."""
    return None if variant == "default" else template.format(variant=variant)


def retag(version: str, variant: str) -> str:
    """``2.8.0+cpu`` -> ``2.8.0+cu128``: the same release, another build."""
    base = version.partition("+")[0]
    return base if variant == "default" else f"{base}+{variant}"

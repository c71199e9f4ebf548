"""Region profiles: a name for an ordered list of places (SkyPilot ``infra`` strings).

A place is where SkyPilot may put the resumed run: ``aws/ap-northeast-1`` (a cloud region),
``k8s/<context>`` (a Kubernetes cluster), ``ssh/<pool>`` (an SSH node pool), or anywhere
(no ``infra``, SkyPilot picks the cheapest). The profile's order is the user's preference.

The ``beijing`` profile says what is true: no SkyPilot cloud reaches mainland China. Beijing
capacity exists only as the user's own Kubernetes contexts and SSH pools there, listed in
the config; after those come the nearest public regions (Hong Kong, Tokyo, Seoul,
Singapore). Spot on Kubernetes is something SkyPilot recognises only through GKE
(``cloud.google.com/gke-spot``) or Karpenter (``karpenter.sh/capacity-type``) node labels, so
a context gets spot entries only when the user lists it under ``kubernetes_spot``::

    [regions.beijing]
    kubernetes = ["bj-a100"]          # k8s/bj-a100, on-demand only
    kubernetes_spot = ["bj-karpenter"] # its spot nodes carry Karpenter labels
    ssh = ["bj-lab"]                   # ssh/bj-lab
    [regions.mine]
    infra = ["k8s/lab", "aws/us-west-2", "gcp"]
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from burst.errors import ConfigError

K8S_NO_SPOT = ("no spot: SkyPilot recognises spot nodes on Kubernetes only by GKE or Karpenter "
               "labels (list the context under kubernetes_spot if yours has them)")
SSH_NO_SPOT = "no spot: an SSH pool is fixed capacity"


@dataclass(frozen=True)
class Place:
    """One entry of a profile: where, and whether spot capacity can be asked for there."""

    infra: str | None  # None: anywhere SkyPilot can launch
    spot: bool = True
    note: str = ""

    @property
    def label(self) -> str:
        return self.infra or "any"

    @property
    def own_capacity(self) -> bool:
        """A Kubernetes cluster or SSH pool: the user's, priced by no catalog."""
        kind = (self.infra or "").partition("/")[0].lower()
        return kind in ("k8s", "kubernetes", "ssh")


@dataclass(frozen=True)
class Profile:
    name: str
    places: tuple[Place, ...]
    notes: tuple[str, ...] = ()


def place(infra: str | None, spot_contexts: Sequence[str] = ()) -> Place:
    """A place for an ``infra`` string, with spot support decided by its kind."""
    if infra is None or infra in ("", "*", "any"):
        return Place(None)
    kind, _, rest = infra.partition("/")
    if kind.lower() in ("k8s", "kubernetes"):
        if rest in spot_contexts:
            return Place(infra, True, "spot through GKE/Karpenter node labels")
        return Place(infra, False, K8S_NO_SPOT)
    if kind.lower() == "ssh":
        return Place(infra, False, SSH_NO_SPOT)
    return Place(infra)


_NEAR_BEIJING = (
    "aws/ap-east-1", "gcp/asia-east2", "azure/eastasia",  # Hong Kong
    "aws/ap-northeast-1", "gcp/asia-northeast1", "azure/japaneast",  # Tokyo
    "aws/ap-northeast-2", "gcp/asia-northeast3", "azure/koreacentral",  # Seoul
    "aws/ap-southeast-1", "gcp/asia-southeast1", "azure/southeastasia",  # Singapore
)

BUILTIN: dict[str, tuple[str | None, ...]] = {
    "any": (None,),
    "beijing": _NEAR_BEIJING,
    "us": ("aws/us-east-1", "gcp/us-central1", "azure/eastus", "aws/us-west-2"),
    "europe": ("aws/eu-central-1", "gcp/europe-west4", "azure/westeurope", "aws/eu-west-1"),
}


def profile(name: str, regions: Mapping[str, Any] | None = None) -> Profile:
    """The profile ``name``: user entries from ``[regions.NAME]`` first, then built-in ones."""
    regions = regions or {}
    table = regions.get(name, {})
    if name not in BUILTIN and name not in regions:
        close = difflib.get_close_matches(name, [*BUILTIN, *regions], n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown region profile {name!r}{hint} (known: "
                          f"{', '.join(sorted({*BUILTIN, *regions}))}; add [regions.{name}] "
                          "to the burst config)")
    if not isinstance(table, Mapping):
        raise ConfigError(f"config: [regions.{name}] must be a table")
    user = _user_places(name, table)
    places = (*user, *(place(i) for i in BUILTIN.get(name, ())))
    notes = []
    if name == "beijing":
        notes.append("no SkyPilot cloud reaches mainland China: Beijing capacity comes only "
                     "from your k8s/ssh entries; the rest are the nearest public regions")
        if not user:
            notes.append("no Beijing cluster configured: add kubernetes = [...] or ssh = [...] "
                         "under [regions.beijing] in the burst config")
    return Profile(name, _unique(places), tuple(notes))


def _user_places(name: str, table: Mapping[str, Any]) -> list[Place]:
    allowed = {"kubernetes", "kubernetes_spot", "ssh", "infra"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"config: [regions.{name}] has unknown field {unknown[0]!r} "
                          f"(use {', '.join(sorted(allowed))})")
    lists = {key: _strings(table.get(key, []), name, key) for key in allowed}
    spot_contexts = lists["kubernetes_spot"]
    infras = [*(f"k8s/{c}" for c in [*spot_contexts, *lists["kubernetes"]]),
              *(f"ssh/{p}" for p in lists["ssh"]), *lists["infra"]]
    return [place(i, spot_contexts) for i in infras]


def _strings(value: Any, name: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"config: [regions.{name}] {key} must be a list of names")
    return list(value)


def _unique(places: Sequence[Place]) -> tuple[Place, ...]:
    seen: dict[str | None, Place] = {}
    for one in places:
        seen.setdefault(one.infra, one)
    return tuple(seen.values())

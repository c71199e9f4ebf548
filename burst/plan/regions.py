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
    image_id = "docker:registry.cn-beijing.aliyuncs.com/me/skypilot:latest"
    order = ["own", "spot", "on-demand"]
    [regions.mine]
    infra = ["k8s/lab", "aws/us-west-2", "gcp"]

``order`` is the failover policy by tier: ``own`` (the user's Kubernetes contexts and SSH
pools), ``spot`` (public clouds, spot), ``on-demand`` (public clouds, on-demand). The
default puts the user's own capacity first: it is paid for already, and for Beijing it
is the only capacity inside mainland China. ``image_id`` is the container image the
profile's own-capacity nodes start from: SkyPilot's default image lives on
``*-docker.pkg.dev``, which nodes in mainland China cannot reach, so a mirror registry
goes here (``docker:<registry>/<image>:<tag>``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from burst.errors import ConfigError

K8S_NO_SPOT = ("no spot: SkyPilot recognises spot nodes on Kubernetes only by GKE or Karpenter "
               "labels (list the context under kubernetes_spot if yours has them)")
SSH_NO_SPOT = "no spot: an SSH pool is fixed capacity"
OWN, SPOT, ON_DEMAND = "own", "spot", "on-demand"
TIERS = (OWN, SPOT, ON_DEMAND)
DEFAULT_ORDER = TIERS
DEFAULT_IMAGE_HOST = "docker.pkg.dev"  # where SkyPilot's default Kubernetes image lives


@dataclass(frozen=True)
class Place:
    """One entry of a profile: where, and whether spot capacity can be asked for there."""

    infra: str | None  # None: anywhere SkyPilot can launch
    spot: bool = True
    note: str = ""
    image_id: str | None = None  # the node image (own capacity: a reachable mirror)

    @property
    def label(self) -> str:
        return self.infra or "any"

    @property
    def own_capacity(self) -> bool:
        """A Kubernetes cluster or SSH pool: the user's, priced by no catalog."""
        kind = (self.infra or "").partition("/")[0].lower()
        return kind in ("k8s", "kubernetes", "ssh")

    def tier(self, spot: bool) -> str:
        """The failover tier of this place asked for with or without spot."""
        if self.own_capacity:
            return OWN
        return SPOT if spot else ON_DEMAND


@dataclass(frozen=True)
class Profile:
    name: str
    places: tuple[Place, ...]
    notes: tuple[str, ...] = ()
    order: tuple[str, ...] = DEFAULT_ORDER
    image_id: str | None = None


def parse_order(value: object, where: str = "order") -> tuple[str, ...]:
    """A tier order from config (a list) or the command line (``own,spot,on-demand``)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{where} must name tiers from {', '.join(TIERS)}")
    names = [str(item).strip().lower().replace("_", "-") for item in items]
    names = ["on-demand" if n in ("ondemand", "on-demand", "demand") else n for n in names]
    unknown = [n for n in names if n not in TIERS]
    if unknown or len(set(names)) != len(names):
        bad = unknown[0] if unknown else "a repeated tier"
        raise ConfigError(f"{where}: {bad!r} is not a tier; use some of {', '.join(TIERS)} "
                          "once each, in the order to try them")
    return tuple(names)


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
    image = _image_id(table.get("image_id"), name)
    user = [replace(p, image_id=image) if p.own_capacity else p
            for p in _user_places(name, table)]
    places = (*user, *(place(i) for i in BUILTIN.get(name, ())))
    order = parse_order(table["order"], f"config: [regions.{name}] order") if (
        "order" in table) else DEFAULT_ORDER
    notes = []
    if name == "beijing":
        notes.append("no SkyPilot cloud reaches mainland China: Beijing capacity comes only "
                     "from your k8s/ssh entries; the rest are the nearest public regions")
        if not user:
            notes.append("no Beijing cluster configured: add kubernetes = [...] or ssh = [...] "
                         "under [regions.beijing] in the burst config")
        elif image is None and any(p.own_capacity for p in user):
            notes.append(f"k8s/ssh nodes in mainland China cannot pull SkyPilot's default "
                         f"image from *-{DEFAULT_IMAGE_HOST}: set image_id = "
                         "\"docker:<mirror registry>/<image>\" under [regions.beijing]")
    if image is not None:
        notes.append(f"own-capacity nodes start from image_id {image} (not SkyPilot's "
                     f"default image on *-{DEFAULT_IMAGE_HOST})")
    return Profile(name, _unique(places), tuple(notes), order, image)


def _image_id(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ConfigError(f"config: [regions.{name}] image_id must be an image name such as "
                          "\"docker:registry.example.cn/skypilot:latest\"")
    return value


def _user_places(name: str, table: Mapping[str, Any]) -> list[Place]:
    allowed = {"kubernetes", "kubernetes_spot", "ssh", "infra"}
    unknown = sorted(set(table) - allowed - {"order", "image_id"})
    if unknown:
        raise ConfigError(f"config: [regions.{name}] has unknown field {unknown[0]!r} "
                          f"(use {', '.join(sorted(allowed | {'order', 'image_id'}))})")
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

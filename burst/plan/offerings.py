"""Which (cloud, region, card, spot) places exist, and what they cost there.

The planner crosses every card with every place of a profile; most of those crossings do
not exist (GCP has A100-80GB in one Asian region, no cloud rents an RTX 4090). A
crossing that does not exist must never take one of the ordered candidate slots, so each
is checked here first:

1. SkyPilot's own catalog, when it is on this machine: the ``vms.csv`` files SkyPilot
   caches under ``$SKY_RUNTIME_DIR`` (default ``~``) ``/.sky/catalogs/v8/<cloud>/``.
   Read directly with :mod:`csv`: asking SkyPilot would download a missing file, and
   planning must work offline. ``$BURST_SKYPILOT_CATALOG`` names another directory of
   the same layout. A cloud whose file is there is known completely: a card or region
   missing from it does not exist, and a row without ``SpotPrice`` has no spot.
2. Else the sourced, dated table in :mod:`burst.plan.offered`.
3. Else the place is unverified: kept, with a note saying so.

Kubernetes contexts, SSH pools and "anywhere" are live capacity no static catalog
describes; they are never checked here.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from burst.plan import offered

CATALOG_ENV = "BURST_SKYPILOT_CATALOG"
SKY_RUNTIME_ENV = "SKY_RUNTIME_DIR"
SCHEMA = "v8"  # sky.skylet.constants.CATALOG_SCHEMA_VERSION in SkyPilot 0.14.1
CLOUDS = ("aws", "gcp", "azure", "lambda")
_PUBLIC = frozenset(CLOUDS) | {"oci", "nebius", "runpod", "lambdalabs", "fluidstack", "cudo",
                                "paperspace", "ibm", "scp", "vast", "do", "hyperbolic"}


@dataclass(frozen=True)
class Offer:
    """A card in one region: cheapest per-GPU prices there (None: unknown)."""

    on_demand: float | None = None
    spot: float | None = None
    spot_offered: bool = True


@dataclass(frozen=True)
class Verdict:
    """Whether a place exists. ``exists`` None: nothing here can tell."""

    exists: bool | None
    reason: str = ""
    price: float | None = None  # $/h per GPU there, for the asked spot-ness
    note: str = ""


UNCHECKED = Verdict(None)


def key(name: str) -> str:
    """Card names compared as SkyPilot and burst both spell them (``a100-80gb`` = ``A100-80GB``)."""
    return re.sub(r"[\s_-]+", "", name).upper()


def split_infra(infra: str | None) -> tuple[str, str | None] | None:
    """``aws/ap-east-1[/zone]`` -> (cloud, region); None for own capacity and "anywhere"."""
    if not infra:
        return None
    parts = infra.split("/")
    cloud = parts[0].lower()
    if cloud not in _PUBLIC:
        return None
    return cloud, (parts[1] if len(parts) > 1 and parts[1] else None)


class Offerings:
    """Where cards are offered, for the (cloud, card) pairs a source knows completely.

    ``offers``: (cloud, region, card key) -> :class:`Offer`. ``complete``: clouds whose
    every card and region is in ``offers``. ``covered``: (cloud, card key) pairs whose every
    region is. ``absent``: (cloud, card key) pairs offered nowhere. ``notes``: (cloud,
    region) -> something to do before launching there.
    """

    def __init__(self, offers: Mapping[tuple[str, str, str], Offer], origin: str, *,
                 complete: Iterable[str] = (), covered: Iterable[tuple[str, str]] = (),
                 absent: Iterable[tuple[str, str]] = (),
                 notes: Mapping[tuple[str, str], str] | None = None,
                 fallback: Offerings | None = None) -> None:
        self.offers = dict(offers)
        self.origin = origin
        self.complete = frozenset(complete)
        self.covered = frozenset(covered) | {(c, k) for c, _, k in self.offers
                                             if c in self.complete}
        self.absent = frozenset(absent)
        self.notes = dict(notes or {})
        self.fallback = fallback

    @property
    def sources(self) -> list[str]:
        rest = self.fallback.sources if self.fallback else []
        return [self.origin, *rest]

    def check(self, infra: str | None, card: str, spot: bool) -> Verdict:
        """Whether ``card`` (spot or not) exists at ``infra``, and its price there."""
        where = split_infra(infra)
        if where is None:
            return UNCHECKED
        verdict = self._check(*where, key(card), card, spot)
        if verdict.exists is None and self.fallback is not None:
            return self.fallback.check(infra, card, spot)
        return verdict

    def _check(self, cloud: str, region: str | None, card_key: str, card: str,
               spot: bool) -> Verdict:
        known = cloud in self.complete or (cloud, card_key) in self.covered
        if (cloud, card_key) in self.absent or (known and not self._regions(cloud, card_key)):
            return Verdict(False, f"{cloud} offers no {card} in any region ({self.origin})")
        if not known:
            return UNCHECKED
        note = self.notes.get((cloud, region or ""), "")
        if region is None:
            offers = [self.offers[(cloud, r, card_key)] for r in self._regions(cloud, card_key)]
            if spot and not any(o.spot_offered for o in offers):
                return Verdict(False, f"{cloud} offers no spot {card} ({self.origin})")
            return Verdict(True, note=note)
        offer = self.offers.get((cloud, region, card_key))
        if offer is None:
            return Verdict(False, f"{cloud} offers no {card} in {region} ({self.origin})")
        if spot and not offer.spot_offered:
            return Verdict(False, f"{cloud} has no spot {card} in {region} ({self.origin})")
        return Verdict(True, price=offer.spot if spot else offer.on_demand, note=note)

    def _regions(self, cloud: str, card_key: str) -> list[str]:
        return [r for c, r, k in self.offers if c == cloud and k == card_key]


# -- sources ---------------------------------------------------------------------------------


def embedded() -> Offerings:
    """The table in :mod:`burst.plan.offered`."""
    offers = {}
    for (cloud, card), regions in offered.REGIONS.items():
        for region in regions:
            price = offered.PRICES.get((cloud, region, card))
            offers[(cloud, region, key(card))] = Offer(on_demand=price)
    absent = [(cloud, key(card)) for cloud, cards in offered.ABSENT.items() for card in cards]
    return Offerings(offers, offered.SOURCE, covered=[(c, key(k)) for c, k in offered.REGIONS],
                     absent=absent, notes=offered.OPT_IN)


def skypilot_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where SkyPilot caches its catalog (``sky.catalog.common``'s versioned catalog dir)."""
    env = os.environ if environ is None else environ
    if env.get(CATALOG_ENV):
        return Path(env[CATALOG_ENV]).expanduser()
    runtime = Path(env.get(SKY_RUNTIME_ENV) or "~").expanduser()
    return runtime / ".sky" / "catalogs" / SCHEMA


def from_skypilot(directory: Path, clouds: Iterable[str] = CLOUDS,
                  fallback: Offerings | None = None) -> Offerings | None:
    """SkyPilot's cached ``<cloud>/vms.csv`` files under ``directory``; None if there are none.

    Per (cloud, region, accelerator) the cheapest per-GPU price and spot price of any row
    (instance type or, on GCP, the attachable accelerator); ``SpotPrice`` empty or NaN in
    every row means no spot there.
    """
    offers: dict[tuple[str, str, str], Offer] = {}
    read = []
    for cloud in clouds:
        path = directory / cloud / "vms.csv"
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        read.append(cloud)
        for row in rows:
            _add_row(offers, cloud, row)
    if not read:
        return None
    return Offerings(offers, f"SkyPilot's cached catalog ({', '.join(read)})", complete=read,
                     notes=offered.OPT_IN, fallback=fallback)


def _add_row(offers: dict[tuple[str, str, str], Offer], cloud: str, row: Mapping[str, str]
             ) -> None:
    name, region = (row.get("AcceleratorName") or "").strip(), (row.get("Region") or "").strip()
    count = _number(row.get("AcceleratorCount"))
    if not name or not region or not count:
        return
    place = (cloud, region, key(name))
    price, spot = _number(row.get("Price")), _number(row.get("SpotPrice"))
    old = offers.get(place, Offer(spot_offered=False))
    offers[place] = Offer(_cheaper(old.on_demand, price and price / count),
                          _cheaper(old.spot, spot and spot / count),
                          old.spot_offered or spot is not None)


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def _cheaper(a: float | None, b: float | None) -> float | None:
    known = [x for x in (a, b) if x is not None]
    return min(known) if known else None


def load(environ: Mapping[str, str] | None = None) -> Offerings:
    """SkyPilot's cached catalog for the clouds it has, the embedded table for the rest."""
    table = embedded()
    return from_skypilot(skypilot_dir(environ), fallback=table) or table

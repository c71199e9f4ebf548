"""The GPU card catalog: what each card can hold, how fast it is, and roughly what it costs.

The planner needs four facts per card: memory (does the run fit), bf16 support (which
mixed precision), dense tensor throughput (how long the rest of the run takes) and a price
(which fitting card is cheapest). An embedded table answers all four offline. Specs are
NVIDIA's dense (no-sparsity) datasheet figures; prices are typical per-GPU list prices in a
US region on the date given, for *ranking* candidates, not for billing. Spot prices move
hourly and are left empty where no stable figure exists.

When SkyPilot's catalog can be read (:func:`skypilot_offerings`, lazy, with a timeout,
never required) its per-GPU memory and cheapest prices replace the embedded ones
(:func:`refine`). Cards the table lacks come from the user's configuration::

    [gpus.A6000]
    memory_gib = 48
    compute_capability = "8.6"
    bf16 = true
    tflops_16 = 154.8
    on_demand = 0.80
    aliases = ["RTX A6000", "NVIDIA RTX A6000"]
"""

from __future__ import annotations

import difflib
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from burst.errors import ConfigError

GIB = 1 << 30
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda")  # static catalogs; no live cluster is asked


@dataclass(frozen=True)
class Card:
    """One GPU model. Throughputs are dense TFLOP/s per GPU; prices are $/h per GPU."""

    name: str  # SkyPilot's accelerator name, e.g. "A100-80GB"
    memory_gib: float
    compute_capability: tuple[int, int]
    bf16: bool
    fp8: bool
    tflops_16: float | None  # bf16 (or fp16 where no bf16) tensor core, fp32 accumulate
    tflops_tf32: float | None  # None before Ampere (no TF32)
    tflops_fp32: float | None  # plain fp32, no tensor cores
    on_demand: float | None = None
    spot: float | None = None
    source: str = ""
    date: str = ""
    aliases: tuple[str, ...] = field(default=())

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def tf32(self) -> bool:
        """TF32 tensor cores exist from compute capability 8.0 (Ampere) on."""
        return self.compute_capability >= (8, 0)

    def tflops(self, amp: str | None, tf32: bool) -> float | None:
        """The throughput that bounds a run in precision ``amp`` (None: fp32)."""
        if amp is not None:
            return self.tflops_16
        if tf32 and self.tflops_tf32:
            return self.tflops_tf32
        return self.tflops_fp32


def _card(name: str, gib: float, cc: str, bf16: bool, fp8: bool, t16: float | None,
          tf32: float | None, fp32: float | None, od: float | None, spot: float | None,
          source: str, date: str, *aliases: str) -> Card:
    major, minor = (int(x) for x in cc.split("."))
    return Card(name, gib, (major, minor), bf16, fp8, t16, tf32, fp32, od, spot, source, date,
                tuple(aliases))


_AWS = "AWS EC2 us-east-1 on-demand list price per GPU"
_GCP = "GCP us-central1 on-demand list price per GPU (VM included)"
_SPOT = "spot: typical, varies by region and hour"

# name, GiB, CC, bf16, fp8, dense 16-bit, dense TF32, fp32, $/h on-demand, $/h spot, source, date
BUILTIN: tuple[Card, ...] = (
    _card("T4", 16, "7.5", False, False, 65, None, 8.1, 0.526, 0.21,
          f"NVIDIA T4 datasheet; {_AWS} (g4dn.xlarge); {_SPOT}", "2025-06", "Tesla T4"),
    _card("V100", 16, "7.0", False, False, 125, None, 15.7, 3.06, 0.92,
          f"NVIDIA V100 SXM2 datasheet; {_AWS} (p3.2xlarge); {_SPOT}", "2025-06",
          "Tesla V100", "V100-16GB"),
    _card("V100-32GB", 32, "7.0", False, False, 125, None, 15.7, 3.90, 1.17,
          f"NVIDIA V100 SXM2 datasheet; {_AWS} (p3dn.24xlarge / 8); {_SPOT}", "2025-06"),
    _card("A10G", 24, "8.6", True, False, 70, 35, 31.2, 1.006, 0.40,
          f"AWS G5 documentation (A10G); {_AWS} (g5.xlarge); {_SPOT}", "2025-06"),
    _card("A10", 24, "8.6", True, False, 125, 62.5, 31.2, 0.75, None,
          "NVIDIA A10 datasheet; Lambda on-demand list price (gpu_1x_a10)", "2025-06"),
    _card("L4", 24, "8.9", True, True, 121, 60, 30.3, 0.805, 0.32,
          f"NVIDIA L4 datasheet; {_AWS} (g6.xlarge); {_SPOT}", "2025-06"),
    _card("L40S", 48, "8.9", True, True, 362, 183, 91.6, 1.861, 0.75,
          f"NVIDIA L40S datasheet; {_AWS} (g6e.xlarge); {_SPOT}", "2025-06"),
    _card("RTX3090", 24, "8.6", True, False, 71, 35.6, 35.6, None, None,
          "NVIDIA GA102 whitepaper (fp16 tensor, fp32 accumulate); no list price in "
          "SkyPilot's major clouds", "2025-06", "RTX 3090", "GeForce RTX 3090"),
    _card("RTX4090", 24, "8.9", True, True, 165.2, 82.6, 82.6, None, None,
          "NVIDIA Ada whitepaper (fp16 tensor, fp32 accumulate); no list price in "
          "SkyPilot's major clouds", "2025-06", "RTX 4090", "GeForce RTX 4090"),
    _card("A100", 40, "8.0", True, False, 312, 156, 19.5, 3.67, 1.10,
          f"NVIDIA A100 datasheet; {_GCP} (a2-highgpu-1g); {_SPOT}", "2025-06",
          "A100-40GB"),
    _card("A100-80GB", 80, "8.0", True, False, 312, 156, 19.5, 5.07, 1.57,
          f"NVIDIA A100 datasheet; {_GCP} (a2-ultragpu-1g); {_SPOT}", "2025-06"),
    _card("H100", 80, "9.0", True, True, 989, 495, 67, 6.88, None,
          f"NVIDIA H100 SXM datasheet; {_AWS} (p5.48xlarge / 8, after the June 2025 cut)",
          "2025-06", "H100-80GB", "H100-SXM"),
    _card("H200", 141, "9.0", True, True, 989, 495, 67, 7.91, None,
          f"NVIDIA H200 SXM datasheet; {_AWS} (p5en.48xlarge / 8, approximate)", "2025-06"),
    _card("B200", 180, "10.0", True, True, 2250, 1100, 75, 14.24, None,
          f"NVIDIA HGX B200 datasheet (per GPU); {_AWS} (p6-b200.48xlarge / 8, approximate)",
          "2025-06"),
)

# How ``torch.cuda.get_device_name()`` spells the cards, most specific pattern first.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bA100\b.*\b80\s?GB\b", "A100-80GB"),
    (r"\bA100\b", "A100"),
    (r"\bV100\b.*\b32\s?GB\b", "V100-32GB"),
    (r"\bV100\b", "V100"),
    (r"\bH200\b", "H200"),
    (r"\bH100\b", "H100"),
    (r"\bB200\b", "B200"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bT4\b", "T4"),
    (r"\b3090\b", "RTX3090"),
    (r"\b4090\b", "RTX4090"),
)


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name).upper()


class Catalog:
    """An immutable set of cards, looked up by name or alias, case- and dash-insensitively."""

    def __init__(self, cards: Iterable[Card], origin: str = "embedded") -> None:
        self.origin = origin  # where the figures come from, for display
        self._cards: dict[str, Card] = {}
        for card in cards:
            self._cards[card.name] = card
        self._index = {_key(alias): card.name for card in self._cards.values()
                       for alias in (card.name, *card.aliases)}

    def __iter__(self) -> Iterator[Card]:
        return iter(self._cards.values())

    def __len__(self) -> int:
        return len(self._cards)

    def names(self) -> list[str]:
        return list(self._cards)

    def find(self, name: str) -> Card | None:
        found = self._index.get(_key(name))
        return self._cards[found] if found else None

    def get(self, name: str) -> Card:
        """The card called ``name``; an unknown name is an error listing the closest ones."""
        card = self.find(name)
        if card is not None:
            return card
        raise ConfigError(f"unknown GPU {name!r} ({_suggest(name, self._all_names())}); "
                          "add it as [gpus.NAME] in the burst config")

    def for_device(self, device_name: str) -> Card | None:
        """The card a ``torch.cuda.get_device_name()`` string names, if the catalog has it."""
        card = self.find(device_name) or self.find(device_name.removeprefix("NVIDIA "))
        if card is not None:
            return card
        for pattern, name in _DEVICE_PATTERNS:
            if re.search(pattern, device_name, flags=re.IGNORECASE) and name in self._cards:
                return self._cards[name]
        return None

    def _all_names(self) -> list[str]:
        return [n for card in self._cards.values() for n in (card.name, *card.aliases)]

    def replaced(self, cards: Iterable[Card]) -> Catalog:
        """A catalog with ``cards`` added, or replacing the cards of the same name."""
        return Catalog([*self._cards.values(), *cards], self.origin)


def _suggest(name: str, choices: Sequence[str]) -> str:
    by_key = {_key(c): c for c in choices}
    close = difflib.get_close_matches(_key(name), list(by_key), n=4, cutoff=0.5)
    if not close:
        close = [k for k in by_key if _key(name) in k or k in _key(name)][:4]
    if not close:
        return f"known: {', '.join(sorted(dict.fromkeys(choices))[:16])}"
    return f"did you mean {', '.join(dict.fromkeys(by_key[k] for k in close))}?"


def builtin() -> Catalog:
    return Catalog(BUILTIN)


# -- user extensions ------------------------------------------------------------------------

_NUMBER_FIELDS = ("tflops_16", "tflops_tf32", "tflops_fp32", "on_demand", "spot")


def from_config(gpus: Mapping[str, Any], base: Catalog) -> Catalog:
    """``base`` extended by ``[gpus.NAME]`` tables; a table naming a known card overrides
    only the fields it sets."""
    cards = []
    for name, table in gpus.items():
        if not isinstance(table, Mapping):
            raise ConfigError(f"config: [gpus.{name}] must be a table")
        cards.append(_card_from_table(name, table, base.find(name)))
    if not cards:
        return base
    return Catalog([*base, *cards], f"{base.origin} + config")


def _card_from_table(name: str, table: Mapping[str, Any], known: Card | None) -> Card:
    known_fields = {"memory_gib", "compute_capability", "bf16", "fp8", "aliases", "source",
                    "date", *_NUMBER_FIELDS}
    unknown = sorted(set(table) - known_fields)
    if unknown:
        raise ConfigError(f"config: [gpus.{name}] has unknown field {unknown[0]!r} "
                          f"({_suggest(unknown[0], sorted(known_fields))})")
    if known is None and "memory_gib" not in table:
        raise ConfigError(f"config: [gpus.{name}] needs memory_gib")
    base = known or Card(name, 0, (0, 0), False, False, None, None, None,
                         source="user config", date="")
    changes: dict[str, Any] = {"source": str(table.get("source", "user config"))}
    if "memory_gib" in table:
        changes["memory_gib"] = _positive_number(table["memory_gib"], name, "memory_gib")
    if "compute_capability" in table:
        changes["compute_capability"] = _capability(table["compute_capability"], name)
    for flag in ("bf16", "fp8"):
        if flag in table:
            if not isinstance(table[flag], bool):
                raise ConfigError(f"config: [gpus.{name}] {flag} must be true or false")
            changes[flag] = table[flag]
    for number in _NUMBER_FIELDS:
        if number in table:
            changes[number] = _positive_number(table[number], name, number)
    if "aliases" in table:
        aliases = table["aliases"]
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise ConfigError(f"config: [gpus.{name}] aliases must be a list of strings")
        changes["aliases"] = (*base.aliases, *aliases)
    if "date" in table:
        changes["date"] = str(table["date"])
    return replace(base, name=known.name if known else name, **changes)


def _positive_number(value: Any, card: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"config: [gpus.{card}] {name} must be a positive number, "
                          f"got {value!r}")
    return float(value)


def _capability(value: Any, card: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", str(value))
    if not match:
        raise ConfigError(f"config: [gpus.{card}] compute_capability must look like \"8.6\", "
                          f"got {value!r}")
    return int(match[1]), int(match[2])


# -- SkyPilot's catalog ---------------------------------------------------------------------


def refine(catalog: Catalog, offerings: Mapping[str, Sequence[Any]], fetched_on: str) -> Catalog:
    """``catalog`` with memory and cheapest per-GPU prices taken from SkyPilot's offerings.

    ``offerings`` is what ``sky.catalog.list_accelerators`` returns: accelerator name to
    instance types, each with ``accelerator_count``, ``device_memory`` (GiB per GPU),
    ``price`` and ``spot_price`` (per instance, NaN where unknown). Accelerators the table
    does not know are skipped: without compute capability and bf16 support burst cannot
    plan for them safely (add them in the config instead).
    """
    refined = []
    for name, offers in offerings.items():
        card = catalog.find(name)
        if card is None or not offers:
            continue
        memory = _first_number(getattr(o, "device_memory", None) for o in offers)
        on_demand = _cheapest_per_gpu(offers, "price")
        spot = _cheapest_per_gpu(offers, "spot_price")
        refined.append(replace(
            card,
            memory_gib=memory or card.memory_gib,
            on_demand=on_demand if on_demand is not None else card.on_demand,
            spot=spot if spot is not None else card.spot,
            source=f"{card.source}; memory and prices from SkyPilot's catalog",
            date=fetched_on,
        ))
    if not refined:
        return catalog
    return Catalog([*catalog, *refined], f"{catalog.origin} + SkyPilot ({fetched_on})")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _first_number(values: Iterable[Any]) -> float | None:
    return next((n for n in map(_number, values) if n is not None), None)


def _cheapest_per_gpu(offers: Sequence[Any], attr: str) -> float | None:
    prices = []
    for offer in offers:
        price, count = _number(getattr(offer, attr, None)), _number(
            getattr(offer, "accelerator_count", None))
        if price is not None and count is not None:
            prices.append(price / count)
    return min(prices) if prices else None


def skypilot_offerings(timeout: float = 10.0,
                       clouds: Sequence[str] = SKYPILOT_CLOUDS) -> dict[str, list] | None:
    """SkyPilot's accelerator offerings, or None when SkyPilot is absent, offline or slow.

    The catalog may have to be downloaded, so the call runs on a daemon thread and is
    abandoned after ``timeout`` seconds; a cloud whose catalog fails is skipped. Live
    clusters (Kubernetes, SSH pools) are never asked.
    """
    result: dict[str, list] = {}
    done = threading.Event()

    def work() -> None:
        try:
            from sky import catalog as sky_catalog  # heavy and optional: import on demand
        except Exception:
            done.set()
            return
        for cloud in clouds:
            try:
                found = sky_catalog.list_accelerators(gpus_only=True, clouds=cloud)
            except Exception:
                continue
            for name, offers in found.items():
                result.setdefault(name, []).extend(offers)
        done.set()

    threading.Thread(target=work, name="burst-skypilot-catalog", daemon=True).start()
    if not done.wait(timeout) or not result:
        return None
    return dict(result)


def load(config: Mapping[str, Any] | None = None, *, skypilot: bool = False,
         timeout: float = 10.0, today: str = "") -> Catalog:
    """The catalog a command plans with: embedded table, refined by SkyPilot's catalog when
    asked and reachable, extended by the config's ``[gpus.*]`` tables (which win)."""
    catalog = builtin()
    if skypilot:
        offerings = skypilot_offerings(timeout)
        if offerings:
            catalog = refine(catalog, offerings, today)
    gpus = (config or {}).get("gpus", {})
    if not isinstance(gpus, Mapping):
        raise ConfigError("config: [gpus] must be a table of [gpus.NAME] tables")
    return from_config(gpus, catalog)

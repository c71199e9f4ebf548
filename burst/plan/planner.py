"""The plan: on which card, where, and with what micro-batch, accumulation and precision.

Pure: run facts, cards and places in, plans out; nothing here reads a store, the network
or the clock, so every decision can be tested from plain values.

One plan keeps the run the same run: ``micro_batch * accumulation * world_size`` equals the
snapshot's global batch exactly, or there is no plan (a :class:`PlanError` says why and
names the nearest layouts that would work; nothing changes silently). Within that, it takes
the largest micro-batch whose predicted peak stays under the margin (fewest accumulation
passes, fullest GPU), bf16 autocast where the card has it and fp16 with a GradScaler where
it does not, and TF32 for the fp32 matmuls that remain on Ampere and later.

Candidates are ordered the way SkyPilot's ``resources.ordered`` fails over, tier by tier in
the order the user asked for (default: their own Kubernetes contexts and SSH pools, then
public spot, then public on-demand); within a tier, the cheapest fitting card first and,
for one card, the places in the profile's order. A (place, card, spot) that does not exist
(:mod:`burst.plan.offerings`) never takes a slot. After an OOM only cards with more memory
than the one that failed are candidates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from burst.contract import PlanEnv
from burst.errors import ConfigError
from burst.plan.cards import GIB, Card
from burst.plan.facts import RunFacts
from burst.plan.offerings import Offerings
from burst.plan.regions import DEFAULT_ORDER, OWN, SPOT, Place, Profile, parse_order

DEFAULT_MARGIN = 0.85
CONTEXT_RESERVE = 512 << 20  # CUDA context and driver state: outside max_memory_allocated
AMP_POLICIES = ("auto", "keep", "bf16", "fp16", "none")
SPOT_POLICIES = ("first", "never", "only")
SCALING = {"one": 1.0, "node": 0.9, "nodes": 0.8}  # assumed data-parallel efficiency

class PlanError(ConfigError):
    """No plan for this target; the message says why, ``choices`` what would work."""

    def __init__(self, message: str, choices: dict[str, list[int]] | None = None) -> None:
        super().__init__(message)
        self.choices = choices or {}


@dataclass(frozen=True)
class Options:
    """How to plan: memory margin, precision policy, spot policy."""

    margin: float = DEFAULT_MARGIN
    amp: str = "auto"  # auto: bf16 if the card has it, else fp16; keep: the snapshot's
    spot: str = "first"
    reserve_bytes: int = CONTEXT_RESERVE
    order: tuple[str, ...] | None = None  # tiers to try, in order; None: the profile's

    def __post_init__(self) -> None:
        if self.order is not None:
            object.__setattr__(self, "order", parse_order(self.order))
        if not 0 < self.margin <= 1:
            raise ConfigError(f"memory margin must be in (0, 1], got {self.margin}")
        if self.amp not in AMP_POLICIES:
            raise ConfigError(f"AMP policy {self.amp!r}: use one of {', '.join(AMP_POLICIES)}")
        if self.spot not in SPOT_POLICIES:
            raise ConfigError(f"spot policy {self.spot!r}: use one of "
                              f"{', '.join(SPOT_POLICIES)}")


@dataclass(frozen=True)
class Target:
    """Where the run would go: ``count`` cards per node on ``nodes`` nodes, at ``place``."""

    card: Card
    count: int = 1
    nodes: int = 1
    place: Place = field(default_factory=lambda: Place(None))
    spot: bool = False
    region_price: float | None = None  # $/h per GPU at this place, where a catalog says

    @property
    def world_size(self) -> int:
        return self.count * self.nodes

    @property
    def tier(self) -> str:
        return self.place.tier(self.spot)

    @property
    def price_per_gpu(self) -> float | None:
        if self.region_price is not None:
            return self.region_price
        return self.card.spot if self.spot else self.card.on_demand


@dataclass(frozen=True)
class Plan:
    """One way to continue the run on one target, and what burst predicts for it."""

    target: Target
    global_batch: int
    micro_batch: int
    accumulation: int
    amp: str | None
    grad_scaler: bool
    tf32: bool
    peak_bytes: int | None  # predicted per GPU; None: activations unknown, probe
    budget_bytes: int
    probe: bool  # the new node must find the micro-batch by trying (no measured peaks)
    probe_micro_batches: tuple[int, ...]  # what to try there, largest first
    steps_per_second: float | None = None
    seconds_to_finish: float | None = None
    notes: tuple[str, ...] = ()
    problem: str | None = None  # why this target cannot be used; None: it fits

    @property
    def fits(self) -> bool:
        return self.problem is None

    @property
    def world_size(self) -> int:
        return self.target.world_size

    @property
    def price_per_hour(self) -> float | None:
        price = self.target.price_per_gpu
        if price is None or self.target.place.own_capacity:
            return None  # a cluster or pool of the user's: its price is in no catalog
        return price * self.world_size

    def with_micro_batch(self, micro: int) -> Plan:
        """This plan with a micro-batch the user forced (``--micro-batch``): accumulation
        follows so the global batch stays the same, and no probing overrides the choice."""
        world = self.world_size
        if self.global_batch % (micro * world):
            raise ConfigError(f"forced micro-batch {micro} does not split global batch "
                              f"{self.global_batch} over {world} GPU(s)")
        return replace(self, micro_batch=micro,
                       accumulation=self.global_batch // (micro * world),
                       probe=False, probe_micro_batches=(micro,))

    def to_env(self) -> dict[str, str]:
        """The environment that carries this plan to the new node (read by ``burst.Run``)."""
        return PlanEnv(micro_batch=self.micro_batch, accumulation=self.accumulation,
                       world_size=self.world_size, amp=self.amp or "none",
                       grad_scaler=self.grad_scaler, tf32=self.tf32, probe=self.probe,
                       probe_micro_batches=tuple(self.probe_micro_batches)).to_env()

    def to_dict(self) -> dict[str, Any]:
        target = self.target
        return {
            "card": target.card.name, "count": target.count, "nodes": target.nodes,
            "world_size": self.world_size, "infra": target.place.infra, "spot": target.spot,
            "tier": target.tier, "image_id": target.place.image_id,
            "fits": self.fits, "problem": self.problem,
            "global_batch": self.global_batch, "micro_batch": self.micro_batch,
            "accumulation": self.accumulation, "amp": self.amp,
            "grad_scaler": self.grad_scaler, "tf32": self.tf32,
            "peak_bytes": self.peak_bytes, "budget_bytes": self.budget_bytes,
            "memory_bytes": target.card.memory_bytes, "probe": self.probe,
            "probe_micro_batches": list(self.probe_micro_batches),
            "price_per_hour": self.price_per_hour, "steps_per_second": self.steps_per_second,
            "seconds_to_finish": self.seconds_to_finish, "notes": list(self.notes),
            "env": self.to_env(), "card_info": asdict(target.card),
        }


# -- the batch layout ------------------------------------------------------------------------


def micro_batches(global_batch: int, world_size: int) -> list[int]:
    """Every micro-batch that splits ``global_batch`` exactly over ``world_size``, largest first."""
    per_rank = global_batch // world_size
    return [d for d in range(per_rank, 0, -1) if per_rank % d == 0]


def check_split(global_batch: int, count: int, nodes: int = 1) -> None:
    """Raise a :class:`PlanError` naming the nearest working layouts if the split is inexact."""
    world = count * nodes
    if global_batch % world == 0:
        return
    sizes = [w for w in range(1, global_batch + 1) if global_batch % w == 0]
    below, above = [w for w in sizes if w < world], [w for w in sizes if w > world]
    near_sizes = below[-1:] + above[:1]
    lower, upper = global_batch // world * world, -(-global_batch // world) * world
    batches = [b for b in (lower, upper) if b > 0]
    raise PlanError(
        f"global batch {global_batch} cannot be split evenly over {world} GPUs "
        f"({count} per node x {nodes} node{'s' if nodes > 1 else ''}): burst never changes the "
        f"global batch, so use {_either(near_sizes)} GPUs, or restart the run with global "
        f"batch {_either(batches)} (a different training run)",
        {"world_sizes": near_sizes, "global_batches": batches},
    )


def _either(values: Sequence[object]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


# -- precision -------------------------------------------------------------------------------


def choose_amp(policy: str, card: Card, saved: str | None) -> tuple[str | None, list[str]]:
    """The autocast dtype for ``card`` under ``policy``, and notes on what changes."""
    wanted = {"auto": "bf16" if card.bf16 else "fp16", "keep": saved, "bf16": "bf16",
              "fp16": "fp16", "none": None}[policy]
    if wanted == "bf16" and not card.bf16:
        raise PlanError(f"{card.name} has no bf16 (compute capability "
                        f"{_cc(card)}); use --amp fp16 or --amp auto")
    notes = []
    if wanted != saved:
        notes.append(f"precision {saved or 'fp32'} -> {wanted or 'fp32'}")
    if wanted == "fp16":
        notes.append("fp16 autocast with a GradScaler (dynamic loss scaling)")
        if saved == "bf16":
            notes.append("bf16 -> fp16 narrows the range: values beyond 65504 overflow")
    return wanted, notes


def _cc(card: Card) -> str:
    return ".".join(map(str, card.compute_capability))


# -- one target ------------------------------------------------------------------------------


def plan_for(facts: RunFacts, target: Target, options: Options | None = None,
             old_card: Card | None = None) -> Plan:
    """The plan for ``target``; raises :class:`PlanError` when there is none."""
    options = options or Options()
    check_split(facts.global_batch, target.count, target.nodes)
    card, world = target.card, target.world_size
    amp, notes = choose_amp(options.amp, card, facts.amp)
    tf32 = card.tf32
    budget = int(card.memory_bytes * options.margin) - options.reserve_bytes
    sizes = micro_batches(facts.global_batch, world)
    model = facts.memory
    fixed = model.fixed(amp, world)
    if fixed > budget:
        raise PlanError(_static_too_big(card, fixed, budget, options.margin))
    if model.needs_probe:
        micro = next((m for m in sizes if m <= facts.micro_batch), sizes[-1])
        probe_sizes = tuple(sizes)
        peak = None
        notes.append("no peak memory recorded: activations unknown, the new node probes "
                     f"micro-batches {_either([str(s) for s in probe_sizes][:4])}...")
    else:
        limit = model.largest_fitting(budget, amp, world)
        fitting = [m for m in sizes if m <= limit]
        if not fitting:
            raise PlanError(_activations_too_big(card, model.predict(1, amp, world) or 0,
                                                 budget, options.margin))
        micro = fitting[0]
        probe_sizes = tuple(fitting)
        peak = model.predict(micro, amp, world)
    if amp is None and tf32:
        notes.append("TF32 matmuls on: faster fp32, about 10 mantissa bits")
    speed = _speed(facts, target, amp, tf32, old_card)
    seconds = (facts.steps_remaining / speed if speed and facts.steps_remaining is not None
               else None)
    return Plan(target, facts.global_batch, micro, facts.global_batch // (micro * world), amp,
                amp == "fp16", tf32, peak, budget, model.needs_probe, probe_sizes, speed,
                seconds, tuple(notes))


def _static_too_big(card: Card, fixed: int, budget: int, margin: float) -> str:
    return (f"fits nowhere on {card.name}: weights, gradients and optimizer state alone need "
            f"{_gib(fixed)} per GPU, over the {_gib(budget)} budget ({margin:.0%} of "
            f"{card.memory_gib:g} GiB); choose a bigger card, or shard them over more GPUs "
            "(FSDP/ZeRO); activation checkpointing cannot help here")


def _activations_too_big(card: Card, need: int, budget: int, margin: float) -> str:
    return (f"fits nowhere on {card.name}: even micro-batch 1 needs {_gib(need)} per GPU, over "
            f"the {_gib(budget)} budget ({margin:.0%} of {card.memory_gib:g} GiB); turn on "
            "activation checkpointing, use more GPUs with a sharded model (FSDP), or a bigger "
            "card")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def evaluate(facts: RunFacts, target: Target, options: Options | None = None,
             old_card: Card | None = None) -> Plan:
    """Like :func:`plan_for`, but a target without a plan comes back with its ``problem``."""
    try:
        return plan_for(facts, target, options, old_card)
    except PlanError as error:
        return Plan(target, facts.global_batch, 0, 0, None, False, False, None, 0, False, (),
                    problem=str(error))


# -- speed -----------------------------------------------------------------------------------


def _speed(facts: RunFacts, target: Target, amp: str | None, tf32: bool,
           old_card: Card | None) -> float | None:
    """Steps per second on ``target``: the measured rate scaled by dense TFLOP/s and GPU count.

    An upper-bound style estimate: memory-bound models gain less than the TFLOP/s ratio.
    Without a measured rate or a known old card there is no prediction.
    """
    if facts.steps_per_second is None or old_card is None:
        return None
    old = old_card.tflops(facts.amp, tf32=False)  # PyTorch leaves TF32 matmuls off by default
    new = target.card.tflops(amp, tf32)
    if not old or not new:
        return None
    ratio = (new * target.world_size * _efficiency(target.world_size, target.nodes)) / (
        old * facts.world_size * _efficiency(facts.world_size, 1))
    return facts.steps_per_second * ratio


def _efficiency(world_size: int, nodes: int) -> float:
    if world_size == 1:
        return SCALING["one"]
    return SCALING["nodes"] if nodes > 1 else SCALING["node"]


# -- choosing where --------------------------------------------------------------------------


def candidates(facts: RunFacts, cards: Iterable[Card], profile: Profile,
               counts: Sequence[int] = (1,), nodes: int = 1, options: Options | None = None,
               old_card: Card | None = None, offerings: Offerings | None = None) -> list[Plan]:
    """Every existing (card, count, place, spot) in failover order; fitting ones first.

    See :func:`rank`; places that do not exist are left out.
    """
    return rank(facts, cards, profile, counts, nodes, options, old_card, offerings).plans


@dataclass(frozen=True)
class Ranking:
    """Candidates in failover order, and the crossings left out because they do not exist."""

    plans: list[Plan]
    skipped: list[tuple[Target, str]]  # (where it would have gone, why it does not exist)
    order: tuple[str, ...]


def rank(facts: RunFacts, cards: Iterable[Card], profile: Profile,
         counts: Sequence[int] = (1,), nodes: int = 1, options: Options | None = None,
         old_card: Card | None = None, offerings: Offerings | None = None) -> Ranking:
    """Candidates tier by tier (``options.order``, else the profile's), each tier cheapest
    card first and, for one card, in the profile's order of places.

    Tiers: ``own`` (k8s/ssh places, spot entries first where a context has spot labels),
    ``spot`` and ``on-demand`` (public places); the spot policy removes spot or on-demand
    entries. A crossing ``offerings`` says does not exist is skipped with its reason.
    Targets without a plan follow the fitting ones, once each, with their problem.
    """
    options = options or Options()
    order = options.order or profile.order or DEFAULT_ORDER
    base = [evaluate(facts, Target(card, count, nodes), options, old_card)
            for card in cards for count in counts]
    base = [_exclude_not_bigger(plan, facts, old_card) for plan in base]
    fitting = [p for p in base if p.fits]
    ordered: list[Plan] = []
    skipped: list[tuple[Target, str]] = []
    for tier in order:
        for spot in _tier_spots(tier, options.spot):
            for plan in sorted(fitting, key=lambda p: _rank(p, spot)):
                for where in profile.places:
                    if where.own_capacity != (tier == OWN) or (spot and not where.spot):
                        continue
                    placed = _place(plan, where, spot, offerings)
                    if isinstance(placed, Plan):
                        ordered.append(placed)
                    else:
                        skipped.append(placed)
    return Ranking(ordered + [p for p in base if not p.fits], skipped, tuple(order))


def _tier_spots(tier: str, policy: str) -> tuple[bool, ...]:
    allowed = _tiers(policy)
    if tier == OWN:
        return allowed
    wanted = tier == SPOT
    return (wanted,) if wanted in allowed else ()


def _place(plan: Plan, where: Place, spot: bool, offerings: Offerings | None
           ) -> Plan | tuple[Target, str]:
    target = replace(plan.target, place=where, spot=spot)
    notes = plan.notes + ((where.note,) if where.note else ())
    if offerings is not None:
        verdict = offerings.check(where.infra, target.card.name, spot)
        if verdict.exists is False:
            return target, verdict.reason
        if verdict.exists is None and where.infra and not where.own_capacity:
            notes += (f"{where.infra}: no catalog lists {target.card.name} here; unverified",)
        if verdict.note:
            notes += (verdict.note,)
        target = replace(target, region_price=verdict.price)
    if where.image_id:
        notes += (f"image_id {where.image_id}",)
    return replace(plan, target=target, notes=notes)


def _tiers(policy: str) -> tuple[bool, ...]:
    return {"first": (True, False), "never": (False,), "only": (True,)}[policy]


def _rank(plan: Plan, spot: bool) -> tuple[float, float, str, int]:
    card = plan.target.card
    price = (card.spot if spot else None) or card.on_demand
    total = price * plan.world_size if price is not None else math.inf
    return total, card.memory_gib, card.name, plan.target.count


def _exclude_not_bigger(plan: Plan, facts: RunFacts, old_card: Card | None) -> Plan:
    if not (facts.failed_oom and old_card is not None and plan.fits):
        return plan
    if plan.target.card.memory_gib > old_card.memory_gib:
        return plan
    return replace(plan, problem=f"the run ran out of memory on {old_card.name} "
                                 f"({old_card.memory_gib:g} GiB); {plan.target.card.name} "
                                 "is not bigger")


def choose(plans: Sequence[Plan]) -> Plan:
    """The first plan that fits; if none does, the most hopeful target's problem as an error."""
    for plan in plans:
        if plan.fits:
            return plan
    if not plans:
        raise PlanError("no candidate: the allowed cards and places leave nothing to plan")
    biggest = max(plans, key=lambda p: (p.target.card.memory_gib, p.world_size))
    raise PlanError(f"no candidate can take the run: {biggest.problem}")

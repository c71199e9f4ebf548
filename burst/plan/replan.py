"""Planning a stored run: gather the planner's inputs, then call the pure planner.

This is the I/O shell around :mod:`burst.plan.planner`: it reads the run's newest snapshot and
events from its store, the user's config, and (when asked and reachable) SkyPilot's
catalog, and hands plain values to :func:`burst.plan.planner.candidates`. ``burst plan`` shows the
result; ``burst resume`` launches the first fitting plans in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from burst import config as user_config
from burst import events
from burst.errors import ConfigError, SnapshotError
from burst.plan import cards as gpus
from burst.plan import facts, offerings, planner, regions
from burst.snapshot import reader
from burst.store.base import Store

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10


@dataclass(frozen=True)
class Replan:
    """A run's facts and its candidates in failover order (fitting ones first)."""

    facts: facts.RunFacts
    plans: list[planner.Plan]
    profile: regions.Profile
    old_card: gpus.Card | None
    catalog: str  # where the card figures come from: "embedded", "embedded + SkyPilot (date)"
    skipped: tuple[tuple[planner.Target, str], ...] = ()  # crossings that do not exist
    order: tuple[str, ...] = regions.DEFAULT_ORDER  # the tiers, in the order tried
    places_from: tuple[str, ...] = ()  # what said which places exist

    @property
    def chosen(self) -> planner.Plan | None:
        return next((p for p in self.plans if p.fits), None)

    def choose(self) -> planner.Plan:
        """The first fitting plan, or a :class:`~burst.plan.planner.PlanError` saying why none fits."""
        return planner.choose(self.plans)


def replan(
    store: Store,
    run_id: str,
    *,
    cards: Sequence[str] = (),
    region: str = "any",
    infra: Sequence[str] = (),
    counts: Sequence[int] = (1,),
    nodes: int = 1,
    options: planner.Options | None = None,
    total_steps: int | None = None,
    epochs: int | None = None,
    reason: str | None = None,
    config: Mapping[str, Any] | None = None,
    skypilot: bool = False,
    step: int | None = None,
) -> Replan:
    """Plan the run ``run_id`` of ``store`` over the allowed ``cards`` (default: all)."""
    _check_counts(counts, nodes)
    manifest = reader.read_manifest(store, run_id, step)
    if manifest is None:
        raise SnapshotError(f"run {run_id!r} has no snapshot in {store.url}")
    if epochs is not None and total_steps is None:
        total_steps = facts.steps_for_epochs(manifest, epochs)
    run = facts.from_snapshot(manifest, events.read(store, run_id), total_steps=total_steps,
                              reason=reason)
    config = config or {}
    catalog = gpus.load(config, skypilot=skypilot, today=datetime.now(UTC).date().isoformat())
    allowed = [catalog.get(name) for name in cards] if cards else list(catalog)
    profile = (regions.Profile("custom", tuple(regions.place(i) for i in infra)) if infra
               else regions.profile(region, user_config.section(config, "regions")))
    old_card = catalog.for_device(run.card)
    places = offerings.load()
    ranking = planner.rank(run, allowed, profile, counts, nodes, options, old_card, places)
    return Replan(run, ranking.plans, profile, old_card, catalog.origin,
                  tuple(ranking.skipped), ranking.order, tuple(places.sources))


def _check_counts(counts: Sequence[int], nodes: int) -> None:
    if not counts or any(c < 1 for c in counts) or nodes < 1:
        raise ConfigError(f"GPU counts and nodes must be at least 1, got counts "
                          f"{list(counts)} and {nodes} node(s)")

"""Does the planner find at least one place the run fits?

The same call ``burst plan`` makes (:func:`burst.plan.replan.replan`, with the user's
config and, online, SkyPilot's catalog), so a ✓ here means ``burst resume`` has a first
plan to launch, and a ✗ carries the planner's own reason why nothing fits.
"""

from __future__ import annotations

from burst import config as user_config
from burst.errors import BurstError
from burst.plan.replan import replan
from burst.preflight.table import FAIL, OK, Row
from burst.store.base import Store

NAME = "placement"
FIX = "allow more cards (burst plan --gpu ...), another --region or --infra, or more GPUs " \
      "per node (--count); `burst plan RUN` shows each card's problem"


def placement_row(store: Store, run_id: str, *, offline: bool, required: bool = True,
                  region: str = "any") -> Row:
    try:
        result = replan(store, run_id, region=region, config=user_config.load(None),
                        skypilot=not offline)
        result.choose()  # nothing fits: the planner's one-line reason
    except BurstError as error:
        return Row(NAME, FAIL, str(error), FIX, required)
    chosen = result.chosen
    assert chosen is not None  # choose() raised otherwise
    target = chosen.target
    fitting = sum(1 for plan in result.plans if plan.fits)
    return Row(NAME, OK, f"{fitting} fitting place(s); first: {target.count}x {target.card.name} "
               f"at {target.place.label} ({'spot' if target.spot else 'on-demand'}, tier "
               f"{target.tier}), micro-batch {chosen.micro_batch}", required=required)

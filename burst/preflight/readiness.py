"""Is everything but the newest snapshot already in the store?

The stager of a training run publishes how much a burst would still upload if the GPU
failed now (:mod:`burst.env.readiness`). The row passes when that is nothing, and warns
otherwise: a burst still works, it just starts later by the time the row states.
Optional: a run that never pre-staged (an older run, one pushed by hand) can burst too.
"""

from __future__ import annotations

from burst.env import readiness
from burst.preflight.table import OK, WARN, Row
from burst.store.base import Store

NAME = "ready to burst"


def readiness_row(store: Store, local: Store | None, run_id: str) -> Row:
    """The run's newest published readiness, as one row."""
    found = None
    for source in (s for s in (local, store) if s is not None):
        found = readiness.load(source, run_id)
        if found is not None:
            break
    if found is None:
        return Row(NAME, WARN, "no readiness published: no stager has run for this run here",
                   "train with burst.Run and a remote store: it pre-stages the environment",
                   required=False)
    if found.ready:
        return Row(NAME, OK, found.line(), required=False)
    return Row(NAME, WARN, found.line(), "let the run train on (it uploads in the "
               "background), or raise $BURST_STAGE_RATE", required=False)

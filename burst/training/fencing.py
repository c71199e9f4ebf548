"""Stopping a training process whose launch a newer one replaced (a fenced lineage).

Once a newer launch of the run took a generation (:mod:`burst.snapshot.lineage`), every
snapshot this process commits is refused, so training on would burn the card for nothing
and, worse, look alive to a person reading its log. The run notices at the first step
boundary after a refused commit (a flag the commit sets; nothing is asked of the store per
step) and leaves through :func:`stop`: an event, a failure record, one clear line, and
exit code ``Exit.FENCED`` (90, :mod:`burst.contract`), which the agent does not retry.
"""

from __future__ import annotations

import contextlib
import sys
from typing import NoReturn

from burst.contract import Exit, Reason
from burst.snapshot.lineage import Lineage
from burst.training import failure
from burst.training.guard import GuardedRun

FLUSH_SECONDS = 60.0  # the event and any write already under way; refused ones fail fast


def fenced(lineage: Lineage | None) -> bool:
    """Whether a commit saw a newer launch replace this process's (cheap: a flag)."""
    return lineage is not None and lineage.fenced_by is not None


def stop(run: GuardedRun, lineage: Lineage | None) -> NoReturn:
    """Record why, and leave with ``Exit.FENCED``; no new snapshot is attempted."""
    generation = lineage.generation if lineage is not None else None
    newer = lineage.fenced_by if lineage is not None else None
    detail = (f"generation {generation} of the run was replaced by generation {newer}: "
              "another launch now writes this run's snapshots")
    run.record_event("fenced", step=run.step, generation=generation, newer=newer)
    with contextlib.suppress(Exception):  # the refused commit's error is the expected one
        run.flush(FLUSH_SECONDS)
    failure.write_record(Reason.FENCED, Exit.FENCED, step=run.step, rank=run.rank,
                         detail=detail)
    print(f"burst: stopped after step {run.step}: {detail}; exit {Exit.FENCED}",
          file=sys.stderr, flush=True)
    raise SystemExit(Exit.FENCED)

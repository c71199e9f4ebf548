"""What a node will need from the store, uploaded before the GPU fails.

A burst is worth what it does at the moment the card dies. Everything that does not change
step to step (burst's own wheel, the wheelhouse, the code archive, the run's inputs and the
model-hub caches it read) is staged in the store while the run trains, throttled behind
the snapshots, so that at failure time only the newest snapshot's new blobs are left.

Each such thing is a :class:`Part`: it can say what the store still lacks of it
(:class:`Pending`, cheap enough to ask every few seconds) and upload that, resumably (what
is already there is never sent again) and within a :class:`Throttle`'s share of the uplink.
Readiness (``burst status``, ``burst check``, the exporter) is the sum of the parts'
pending work; the background stager walks the parts in order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from burst.store.base import Store


@dataclass(frozen=True)
class Pending:
    """What the store still lacks of one part: how many objects, how many bytes."""

    part: str  # the part's name: "burst-wheel", "wheelhouse", "code", "inputs", "snapshot"
    objects: int = 0
    bytes: int = 0
    detail: str = ""  # one line for a person ("3 of 412 chunks of ~/data/wikitext")

    @property
    def ready(self) -> bool:
        return self.objects == 0 and self.bytes == 0


class Throttle(Protocol):
    """The uplink share staging may use: snapshots go first, staging takes what is left."""

    def wait(self, nbytes: int) -> None:
        """Block until ``nbytes`` more may be sent (a token bucket; paused while a
        snapshot uploads)."""


class Part(Protocol):
    """One thing a node needs that does not change step to step."""

    name: str

    def pending(self, store: Store) -> Pending:
        """What ``store`` still lacks of this part (no upload, no large reads)."""

    def stage(self, store: Store, throttle: Throttle, stop: threading.Event) -> object:
        """Upload what is missing, resumably, returning early once ``stop`` is set (what
        it returns, such as the inputs' manifest, is the part's own business)."""


def total(pendings: Iterable[Pending]) -> Pending:
    """The sum of several parts' pending work, as one line."""
    items = list(pendings)
    waiting = [p for p in items if not p.ready]
    detail = ", ".join(f"{p.part} {p.bytes / 1e6:.1f} MB" for p in waiting)
    return Pending("all", sum(p.objects for p in items), sum(p.bytes for p in items), detail)

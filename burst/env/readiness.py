"""How ready a run is for a burst: what the store still lacks if the GPU failed now.

"If the GPU failed now: N MB still to upload, about T s at the measured uplink; the node
then needs about S s to set up." ``burst status``, ``burst check`` and the exporter show
this record; the stager (:mod:`burst.env.stager`) computes it from its parts' pending work
and writes it, as one small JSON object, to the run's local state (``<run>/readiness.json``
in the local tier, which ``burst status`` reads) and, when it changes from ready to not or
back, to the run's history.

The set-up estimate is a documented heuristic, not a measurement of the node: the node
downloads the wheelhouse from the store at :data:`NODE_DOWNLOAD_RATE` (a cloud node's pull
from an object store in its region; ``$BURST_NODE_DOWNLOAD_RATE`` overrides it, in bytes/s)
and installs at :data:`INSTALL_RATE` bytes of wheel a second (pip unpacking torch's 2.5 GB
takes about a minute), plus :data:`BOOT_SECONDS` for the bootstrap itself (a venv, the
code, the snapshot's manifest). The node's own snapshot pull is left out: its size is in
``burst plan``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from burst.errors import ConfigError
from burst.staging.parts import Pending, total
from burst.store.base import Store, check_key

NODE_DOWNLOAD_RATE = 100e6  # bytes/s a node pulls from its region's object store
NODE_DOWNLOAD_ENV = "BURST_NODE_DOWNLOAD_RATE"
INSTALL_RATE = 40e6  # bytes of wheel pip installs a second
BOOT_SECONDS = 20.0
FILE = "readiness.json"


def key(run_id: str) -> str:
    return check_key(f"{run_id}/{FILE}")


@dataclass
class Readiness:
    """The answer, as plain values (``--json`` prints exactly :meth:`as_dict`)."""

    pending_bytes: int
    pending_objects: int
    upload_seconds: float | None  # None: the uplink is not measured yet
    setup_seconds: float
    uplink_bytes_per_second: float | None
    parts: list[dict[str, Any]] = field(default_factory=list)
    staging: str = "on"  # "on", or why not ("the store is this machine's disk")
    time: float = 0.0

    @property
    def ready(self) -> bool:
        return self.pending_objects == 0 and self.pending_bytes == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ready": self.ready}

    def line(self) -> str:
        """The sentence a person reads."""
        if self.staging != "on":
            head = f"staging off ({self.staging})"
        elif self.ready:
            head = "nothing left to upload"
        else:
            speed = ("uplink not measured yet" if self.upload_seconds is None else
                     f"about {self.upload_seconds:.0f} s at "
                     f"{(self.uplink_bytes_per_second or 0) * 8 / 1e6:.1f} Mbit/s")
            waiting = ", ".join(f"{p['part']} {p['bytes'] / 1e6:.1f} MB"
                                for p in self.parts if p["objects"] or p["bytes"])
            head = (f"{self.pending_bytes / 1e6:.1f} MB still to upload ({waiting}), "
                    f"{speed}")
        return f"if the GPU failed now: {head}; the node then needs about " \
               f"{self.setup_seconds:.0f} s to set up"


def node_download_rate(environ: dict[str, str] | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(NODE_DOWNLOAD_ENV)
    if not raw:
        return NODE_DOWNLOAD_RATE
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigError(f"${NODE_DOWNLOAD_ENV} must be a positive number of bytes/s")
    return value


def setup_seconds(wheel_bytes: int, download_rate: float | None = None) -> float:
    """The heuristic: download the wheelhouse, install it, boot (see the module's doc)."""
    rate = download_rate or node_download_rate()
    return BOOT_SECONDS + wheel_bytes / rate + wheel_bytes / INSTALL_RATE


def estimate(pendings: list[Pending], uplink: float | None, wheel_bytes: int,
             staging: str = "on") -> Readiness:
    """The record for these parts' pending work at ``uplink`` bytes/s."""
    summed = total(pendings)
    seconds = None if uplink is None else summed.bytes / uplink
    if summed.bytes == 0:
        seconds = 0.0
    return Readiness(summed.bytes, summed.objects, seconds, setup_seconds(wheel_bytes), uplink,
                     [asdict(p) for p in pendings], staging, time.time())


def save(store: Store, run_id: str, readiness: Readiness) -> None:
    store.put(key(run_id), json.dumps(readiness.as_dict(), sort_keys=True).encode())


def load(store: Store, run_id: str) -> Readiness | None:
    """The run's newest published readiness; None when no stager has published one."""
    try:
        data = json.loads(store.get(key(run_id)))
        data.pop("ready", None)
        return Readiness(**data)
    except (KeyError, ValueError, TypeError):
        return None

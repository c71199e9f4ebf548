"""``burst check``: would a burst work right now? Every part a burst needs, asked for real.

Which rows are required (a row that is not a pass makes the answer "not ready"):

- the store's write, read, conditional write and delete: always (every burst needs all
  four: backups write, the node reads, snapshot claims are conditional, retention deletes);
- the credentials: always, but only a *known* expiry inside the run's expected remaining
  time fails it; an unknown one warns (a warning is a pass with a caveat);
- with a RUN: its environment record and wheelhouse (the node installs from the store
  alone), and room on the local disk for its next snapshot;
- for a ``skypilot`` target (the default, as for ``burst resume``): SkyPilot's enabled
  clouds and the planner's placement. Offline or unanswered, the clouds row is
  ``unknown`` and the answer is "not ready": nobody checked that a burst can launch.
  For ``ssh://`` or ``local`` targets the placement row is shown but optional (the box is
  what it is) and SkyPilot is not asked;
- each ``ssh://`` target: reachable, with a host key known_hosts vouches for;
- for a ``skypilot`` target whose region profile holds own capacity (``--region beijing``):
  the image those nodes start from and where SkyPilot's managed-jobs controller runs
  (:mod:`burst.preflight.mainland`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from burst import config as user_config
from burst import events
from burst.env import lockfile
from burst.errors import BurstError, ConfigError, SnapshotError
from burst.plan import facts, regions
from burst.preflight import clouds, credentials, disk, environment, mainland, placement
from burst.preflight.readiness import readiness_row
from burst.preflight.store import store_rows
from burst.preflight.table import FAIL, SKIP, Report, Row
from burst.snapshot import reader
from burst.store import open_store
from burst.store.base import Store, check_key
from burst.store.settings import resolve

DEFAULT_HORIZON = timedelta(hours=12)  # the run's remaining time when its pace is unknown
SKYPILOT, LOCAL = "skypilot", "local"


@dataclass
class Request:
    """What to check: a store (and its local tier), maybe a run, and where it would go."""

    store_url: str
    local_url: str | None = None
    run_id: str | None = None
    targets: Sequence[str] = (SKYPILOT,)
    settings: dict[str, Any] = field(default_factory=dict)  # --endpoint-url, --region...
    ssh_config: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    offline: bool = False
    sky_timeout: float = clouds.DEFAULT_TIMEOUT
    ask_skypilot: bool = True  # False: no SkyPilot row (a scheduled check, every tick)
    region: str = "any"  # the region profile a burst would plan in (beijing: its own rows)


def check_targets(targets: Sequence[str]) -> list[str]:
    """``--to`` values: skypilot, local or ssh://..., each checked; default skypilot."""
    out = list(targets) or [SKYPILOT]
    for target in out:
        if target not in (SKYPILOT, LOCAL) and not target.startswith("ssh://"):
            raise ConfigError(f"--to {target!r}: use skypilot, local or ssh://[user@]host[:port]")
    return out


def run(request: Request) -> Report:
    """Every row for ``request``, in the order a burst meets them.

    What the user typed wrong (a malformed store or SSH address, a run the store does not
    know) raises, as for any command; what the world gets wrong becomes a row."""
    targets = check_targets(request.targets)
    store = open_store(request.store_url, **request.settings)
    url, options = resolve(request.store_url, request.settings)
    boxes = _boxes(request, targets)
    if request.run_id:
        check_key(request.run_id)
    local = _local(request, store)
    if request.run_id:
        _known(store, local, request.run_id)
    report = Report()
    report.add(*store_rows(store))
    horizon, note = remaining(store, local, request.run_id)
    report.add(credentials.credentials_row(url, options, horizon, note))
    to_cloud = SKYPILOT in targets
    if request.run_id:
        report.add(*environment.environment_rows(store, request.run_id))
        report.add(readiness_row(store, local, request.run_id))
        report.add(_placement(store, request.run_id, request.offline, to_cloud,
                              request.region))
    if to_cloud and request.ask_skypilot:
        report.add(clouds.clouds_row(offline=request.offline, timeout=request.sky_timeout))
    if to_cloud:
        report.add(*mainland.rows(regions.profile(request.region, user_config.section(
            user_config.load(None), "regions"))))
    if boxes:
        from burst.preflight import ssh  # paramiko loads only when a box is checked

        report.add(*(ssh.ssh_row(box) for box in boxes))
    if request.run_id:
        root = getattr(local, "root", None) if local is not None else None
        sources = [s for s in (local, store) if s is not None]
        report.add(disk.disk_row(Path(root) if root else None, sources, request.run_id))
    return report


def _boxes(request: Request, targets: Sequence[str]) -> list[Any]:
    """The ``ssh://`` targets, parsed through the SSH config (a malformed one raises)."""
    urls = [t for t in targets if t.startswith("ssh://")]
    if not urls:
        return []
    from burst.launch.ssh import Target

    return [Target.parse(url, request.ssh_config, request.identity, request.known_hosts)
            for url in urls]


def _known(store: Store, local: Store | None, run_id: str) -> None:
    """Refuse a run that neither the store nor the local tier has heard of (a typo would
    otherwise show as a table of failures that all say the same thing)."""
    if any(has_run(source, run_id) for source in (store, local) if source is not None):
        return
    raise SnapshotError(f"run {run_id!r} has nothing in {store.url}"
                        + (f" or {local.url}" if local is not None and local is not store
                           else ""))


def has_run(store: Store, run_id: str) -> bool:
    """Whether ``store`` holds anything of the run a burst reads: a snapshot, its history
    or its frozen environment (small lookups and listings, never of its blobs)."""
    return (bool(reader.list_steps(store, run_id)) or events.exists(store, run_id)
            or store.size(lockfile.latest_key(run_id)) is not None)


def _placement(store: Store, run_id: str, offline: bool, required: bool,
               region: str = "any") -> Row:
    if not reader.list_steps(store, run_id):
        return Row(placement.NAME, FAIL if required else SKIP,
                   f"run {run_id!r} has no snapshot in {store.url} to plan from",
                   f"push one: `burst push {run_id}`", required)
    return placement.placement_row(store, run_id, offline=offline, required=required,
                                   region=region)


def _local(request: Request, store: Store) -> Store | None:
    """The local tier, when it is a directory here: ``--local`` when it holds the run (or
    the store is remote), else the store itself when that is a directory (a file:// store
    is a run's only tier unless a schedule backs it up elsewhere)."""
    from burst.store.local import LocalStore

    local: Store | None = None
    if request.local_url:
        try:
            local = open_store(request.local_url)
        except BurstError:
            local = None
    if not isinstance(local, LocalStore) or local.url == store.url:
        return store if isinstance(store, LocalStore) else None
    if isinstance(store, LocalStore) and not (request.run_id and
                                              has_run(local, request.run_id)):
        return store
    return local


def remaining(store: Store, local: Store | None, run_id: str | None) -> tuple[timedelta, str]:
    """How long the run is expected to go on (steps left at its measured pace), and how
    that was found; ``DEFAULT_HORIZON`` when it cannot be told."""
    fallback = (DEFAULT_HORIZON, f"pace unknown: assumed {_hours(DEFAULT_HORIZON)}")
    if not run_id:
        return DEFAULT_HORIZON, f"no run named: assumed {_hours(DEFAULT_HORIZON)}"
    for source in (s for s in (local, store) if s is not None):
        try:
            manifest = reader.read_manifest(source, run_id)
            if manifest is None:
                continue
            run = facts.from_snapshot(manifest, events.read(source, run_id))
        except BurstError:
            continue
        if run.steps_remaining is not None and run.steps_per_second:
            left = timedelta(seconds=run.steps_remaining / run.steps_per_second)
            return left, f"{run.steps_remaining} steps left at {run.steps_per_second:.3g}/s: " \
                         f"{_hours(left)}"
    return fallback


def _hours(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 3600:.1f} h"


def for_schedule(store_url: str, local_url: str, run_id: str, to: str,
                 settings: dict[str, Any] | None = None) -> Callable[[], dict[str, Any]]:
    """The check a deadline schedule runs before each backup, as the fields of its event.

    It asks everything but SkyPilot (a ``sky check`` every few minutes would cost more than
    the backup; ``burst check`` asks it), and plans offline, from the embedded catalog."""

    def preflight() -> dict[str, Any]:
        report = run(Request(store_url, local_url, run_id, (to,), dict(settings or {}),
                             offline=True, ask_skypilot=False))
        return report.event_fields()

    return preflight

"""What a node resuming the run will download, from where, and how long that takes.

``burst plan`` says it before anything is paid for. Each source below lists its items:
the newest snapshot, the code archive, the wheelhouse (burst's wheel among it; what the
chosen policy leaves to a mirror is listed with the mirror as its source), the run's inputs
(data sets and hub-cache files, :mod:`burst.inputs`). A new kind of thing a node fetches
plugs in as one more function in :data:`SOURCES`.

Two speeds time it, each only when burst measured it, else the time is "unmeasured"
(never a guess dressed as a figure):

- what the store still lacks goes up from here first, at the run's uplink as its snapshot
  uploads measured it (the readiness record in the local tier, :mod:`burst.env.readiness`);
- the node then pulls everything from the store at the speed an earlier node of this run
  measured pulling its snapshot (the ``node-pull`` event; pulls under 1 MiB time latency,
  not bandwidth, and are not counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from burst import events
from burst.contract import ENV_TORCH_INDEX
from burst.env import codearchive, freeze, readiness, wheelchoice
from burst.env import wheelhouse as wheels
from burst.env.lockfile import LockfileError
from burst.errors import BurstError
from burst.inputs import chunks
from burst.plan import planner
from burst.resume import wheelpolicy
from burst.resume.node import PULL_EVENT
from burst.snapshot import format as fmt
from burst.snapshot import reader
from burst.snapshot.traffic import MIN_MEASURED_BYTES
from burst.store import Store

STORE, MIRROR = "store", "mirror"
UNMEASURED = "unmeasured"


@dataclass(frozen=True)
class Item:
    """One thing the node fetches."""

    what: str
    source: str  # STORE, or MIRROR (a package index the node must reach)
    bytes: int | None  # None: not known until it is built or fetched
    missing: int = 0  # bytes not in the store yet: uploaded from here first
    note: str = ""


@dataclass(frozen=True)
class Context:
    """What the sources read: the store, the run, where it may go."""

    store: Store
    run_id: str
    local: Store | None = None
    candidates: Sequence[planner.Plan] = ()


@dataclass
class Speed:
    """Bytes per second and where the figure comes from (None: unmeasured)."""

    rate: float | None
    by: str = UNMEASURED

    def seconds(self, size: int) -> float | None:
        return None if self.rate is None or not self.rate else size / self.rate


@dataclass
class Downloads:
    items: list[Item]
    uplink: Speed
    downlink: Speed
    problems: list[str] = field(default_factory=list)

    @property
    def from_store(self) -> int:
        return sum(i.bytes or 0 for i in self.items if i.source == STORE)

    @property
    def to_upload(self) -> int:
        return sum(i.missing for i in self.items)

    def as_dict(self) -> dict[str, Any]:
        return {"items": [asdict(i) for i in self.items],
                "from_store_bytes": self.from_store, "to_upload_bytes": self.to_upload,
                "download_seconds": self.downlink.seconds(self.from_store),
                "upload_seconds": self.uplink.seconds(self.to_upload),
                "downlink": asdict(self.downlink), "uplink": asdict(self.uplink),
                "problems": list(self.problems)}


Source = Callable[[Context], list[Item]]


def snapshot_items(context: Context) -> list[Item]:
    """The newest snapshot (the local tier's, when the store has not got it yet)."""
    remote = reader.read_manifest(context.store, context.run_id)
    local = reader.read_manifest(context.local, context.run_id) if context.local else None
    newest = local if local and (remote is None or local["step"] > remote["step"]) else remote
    if newest is None:
        return []
    blobs = _blob_sizes(newest)
    missing = 0 if newest is remote else sum(
        size for digest, size in blobs.items()
        if context.store.size(fmt.blob_key(context.run_id, digest)) is None)
    note = "" if newest is remote else "newer in the local tier: pushed at resume"
    return [Item(f"snapshot step {newest['step']}", STORE, sum(blobs.values()), missing, note)]


def code_items(context: Context) -> list[Item]:
    ref = codearchive.latest_ref(context.store, context.run_id)
    if not ref or not ref.get("archive"):
        return []
    size = context.store.size(codearchive.archive_key(context.run_id, ref["archive"]))
    return [Item("code archive", STORE, size)]


def wheel_items(context: Context) -> list[Item]:
    """The wheelhouse of the run's lockfile; what its policy leaves out, from a mirror."""
    try:
        lock, _ = freeze.load_frozen(context.store, context.run_id)
    except LockfileError:
        return []
    index = wheels.load_index(context.store, context.run_id, lock.digest)
    if index is None:
        decision = wheelpolicy.decide(
            lock, flags=wheelchoice.Choice(),
            recorded=wheelchoice.recorded(context.store, context.run_id), stored=None,
            candidates=context.candidates, to="skypilot")
        if decision.target.policy == "none":
            return [Item("burst and every dependency", MIRROR, None,
                         note=f"no wheelhouse, policy {decision.why}")]
        return [Item("wheelhouse", STORE, None, note="not in the store yet: built and "
                     f"uploaded at resume, policy {decision.why}")]
    listed = index.get("wheels") or []
    missing = sum(int(w["size"]) for w in listed
                  if context.store.size(wheels.wheel_key(w["sha256"], w["file"])) is None)
    items = [Item(f"wheelhouse ({len(listed)} wheels)", STORE,
                  sum(int(w["size"]) for w in listed), missing,
                  f"policy {(index.get('target') or {}).get('policy', '?')}")]
    for left in index.get("missing") or []:
        items.append(Item(f"{left.get('name')} {left.get('version')}", MIRROR, None,
                          note=f"{left.get('why')} (${ENV_TORCH_INDEX} or a package index)"))
    return items


def input_items(context: Context) -> list[Item]:
    """The run's inputs: data sets and hub-cache files, in content-addressed chunks."""
    manifest = chunks.load(context.store, context.run_id)
    if manifest is None or not manifest.files:
        return []
    known = chunks.stored_chunks(context.store)
    missing = sum(_chunk_size(f, i) for f in manifest.files
                  for i, digest in enumerate(f.chunks) if digest not in known)
    return [Item(f"inputs ({len(manifest.files)} files)", STORE,
                 sum(f.size for f in manifest.files), missing)]


SOURCES: tuple[Source, ...] = (snapshot_items, code_items, wheel_items, input_items)


def downloads(store: Store, run_id: str, *, local: Store | None = None,
              candidates: Sequence[planner.Plan] = (),
              sources: Sequence[Source] = SOURCES) -> Downloads:
    """Everything the node would fetch to resume ``run_id`` now, and the speeds to time it.
    A source that cannot read its part says so in ``problems`` rather than stopping the
    plan."""
    context = Context(store, run_id, local, candidates)
    items: list[Item] = []
    problems = []
    for source in sources:
        try:
            items += source(context)
        except BurstError as error:
            problems.append(f"{source.__name__.replace('_items', '')}: {error}")
    return Downloads(items, uplink(local, run_id), downlink(store, local, run_id), problems)


def uplink(local: Store | None, run_id: str) -> Speed:
    """The run's uplink as its snapshot uploads measured it (the readiness record)."""
    record = readiness.load(local, run_id) if local is not None else None
    rate = record.uplink_bytes_per_second if record is not None else None
    return Speed(rate, "the run's snapshot uploads") if rate else Speed(None)


def downlink(store: Store, local: Store | None, run_id: str) -> Speed:
    """The store's speed to a node, as the newest node of this run measured its pull."""
    history = events.read(store, run_id)
    if local is not None and local.url != store.url:
        history += events.read(local, run_id)
    pulls = sorted((e for e in history if e.get("event") == PULL_EVENT
                    and _number(e.get("bytes")) >= MIN_MEASURED_BYTES
                    and _number(e.get("seconds")) > 0), key=lambda e: str(e.get("time")))
    if not pulls:
        return Speed(None)
    newest = pulls[-1]
    return Speed(_number(newest["bytes"]) / _number(newest["seconds"]),
                 f"a node's snapshot pull at {str(newest.get('time', '?'))[:16]}")


def _blob_sizes(manifest: dict[str, Any]) -> dict[str, int]:
    return {digest: int(info.get("size", 0)) for digest, info in
            (manifest.get("blobs") or {}).items() if isinstance(info, dict)}


def _chunk_size(entry: chunks.FileEntry, index: int) -> int:
    return max(0, min(chunks.CHUNK_BYTES, entry.size - index * chunks.CHUNK_BYTES))


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0

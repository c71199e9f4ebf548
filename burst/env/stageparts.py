"""The parts a node needs that exist today: burst's own wheel, the wheelhouse, the code.

Each is a :class:`burst.staging.parts.Part`. What makes staging resumable is the store's
layout, not bookkeeping: every object is content-addressed (``wheels/<sha256>/<file>``,
``<run>/code/<sha256>.tar.gz``) and written whole or not at all, so a stager killed
mid-way and started again asks the store what it lacks and sends exactly that. An index
(the wheelhouse's) is written last, once every wheel it names is there.

``pending()`` is cheap: a key found in the store is remembered (content-addressed objects
do not change), so a ready part costs no request; the wheelhouse's completeness is asked
at most every :data:`RECHECK_SECONDS`. The multi-GB wheelhouse is built (pip download,
cached in ``~/.cache/burst/wheels``) by the first ``stage()``, never by ``pending()``.

:data:`FACTORIES` lists what makes the parts of a run, in staging order; the run's inputs
plug in with one more entry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from burst.env import codearchive, wheelchoice, wheelhouse
from burst.env.lockfile import Lockfile
from burst.inputs import part as inputs_part
from burst.staging.parts import Part, Pending, Throttle
from burst.store.base import Store

RECHECK_SECONDS = 60.0  # how stale a "the wheelhouse is complete in the store" may be


@dataclass
class Context:
    """What the parts of one run are made from."""

    run_id: str
    lock: Callable[[], Lockfile]  # the run's frozen lockfile (built once per process)
    code_dir: Path
    exclude: list[Path] = field(default_factory=list)  # stores inside the tree
    target: wheelhouse.Target | None = None  # None: wheelhouse.target_for(lock)
    # how the wheelhouse is obtained (pip download, cached): wheelhouse.build
    build: Callable[[Lockfile, wheelhouse.Target], wheelhouse.Wheelhouse] | None = None
    clock: Callable[[], float] = time.monotonic


class Present:
    """Keys known to be in the store: asked once each, never again (content-addressed)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def has(self, store: Store, key: str) -> bool:
        if (store.url, key) in self._seen:
            return True
        if store.size(key) is None:
            return False
        self._seen.add((store.url, key))
        return True

    def add(self, store: Store, key: str) -> None:
        self._seen.add((store.url, key))


class Stopped(Exception):
    """Raised from a pace callback to end an upload early (what landed is kept)."""


def send_file(store: Store, key: str, path: Path, throttle: Throttle,
              stop: threading.Event) -> bool:
    """Upload one file under ``key`` within the throttle; False when stopped first.

    Through the store's ``put_file`` (parts paced one by one, a killed upload continued
    where the backend can), else one atomic write of the whole file: either way a kill
    leaves the object whole or absent, never a prefix."""

    def pace(nbytes: int) -> None:
        throttle.wait(nbytes)
        if stop.is_set():
            raise Stopped

    put_file = getattr(store, "put_file", None)
    try:
        if put_file is not None:
            put_file(key, path, pace)
        else:
            pace(path.stat().st_size)
            store.put_if_absent(key, path.read_bytes())
    except Stopped:
        return False
    return True


class CodePart:
    """The code archive the run was frozen with (captured once, like the freeze's)."""

    name = "code"

    def __init__(self, context: Context) -> None:
        self.context = context
        self._captured: codearchive.Captured | None = None
        self._present = Present()
        self._lock = threading.Lock()

    def captured(self) -> codearchive.Captured:
        with self._lock:
            if self._captured is None:
                self._captured = codearchive.capture(self.context.code_dir,
                                                     exclude=self.context.exclude)
            return self._captured

    def key(self) -> str:
        return codearchive.archive_key(self.context.run_id, self.captured().digest)

    def pending(self, store: Store) -> Pending:
        captured = self.captured()
        if self._present.has(store, self.key()):
            return Pending(self.name)
        return Pending(self.name, 1, len(captured.tar_gz),
                       f"archive {captured.digest[:12]} ({captured.files} files)")

    def stage(self, store: Store, throttle: Throttle, stop: threading.Event) -> None:
        if self.pending(store).ready:
            return
        captured = self.captured()
        throttle.wait(len(captured.tar_gz))
        if stop.is_set():
            return
        codearchive.upload(store, self.context.run_id, captured)
        self._present.add(store, self.key())


class Wheels:
    """The run's wheelhouse, built at most once, shared by the two wheel parts."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.present = Present()
        self._house: wheelhouse.Wheelhouse | None = None
        self._complete_at: dict[str, float] = {}  # store url -> when found complete
        self._target: wheelhouse.Target | None = None
        self._lock = threading.Lock()

    def target(self, store: Store) -> wheelhouse.Target:
        """What the freeze would build: the choice recorded at freeze or push (``burst
        push --wheels no-torch``), else the environment's (:mod:`burst.env.wheelchoice`)."""
        if self._target is None:
            self._target = self.context.target or wheelchoice.target(
                wheelchoice.in_effect(store, self.context.run_id), self.context.lock(), "all")
        return self._target

    def off(self, store: Store) -> bool:
        return self.target(store).policy == "none"

    def index_key(self) -> str:
        return wheelhouse.index_key(self.context.run_id, self.context.lock().digest)

    def complete(self, store: Store) -> bool:
        """The store holds this lockfile's index, for this target, and every wheel in it."""
        seen = self._complete_at.get(store.url)
        if seen is not None and self.context.clock() - seen < RECHECK_SECONDS:
            return True
        index = wheelhouse.load_index(store, self.context.run_id, self.context.lock().digest)
        if index is None or index.get("target") != self.target(store).to_json():
            return False
        if not all(self.present.has(store, wheelhouse.wheel_key(w["sha256"], w["file"]))
                   for w in index.get("wheels", [])):
            return False
        self._complete_at[store.url] = self.context.clock()
        return True

    def built(self) -> wheelhouse.Wheelhouse | None:
        return self._house

    def build(self, store: Store) -> wheelhouse.Wheelhouse:
        with self._lock:
            if self._house is None:
                build = self.context.build or wheelhouse.build
                self._house = build(self.context.lock(), self.target(store))
            return self._house

    def missing(self, store: Store, roles: Callable[[str], bool]) -> list[wheelhouse.Wheel]:
        house = self._house
        wheels = [] if house is None else [w for w in house.wheels if roles(w.role)]
        return [w for w in wheels if not self.present.has(store, w.key)]

    def put_index(self, store: Store) -> None:
        house = self.build(store)
        if all(self.present.has(store, w.key) for w in house.wheels):
            wheelhouse.upload(store, self.context.run_id, self.context.lock().digest, house)
            self._complete_at[store.url] = self.context.clock()


class WheelPart:
    """Some of the wheelhouse's wheels: burst's own (``burst-wheel``) or the rest
    (``wheelhouse``, which also writes the index, last)."""

    def __init__(self, wheels: Wheels, name: str, roles: Callable[[str], bool],
                 writes_index: bool) -> None:
        self.wheels, self.name, self.roles, self.writes_index = wheels, name, roles, writes_index

    def pending(self, store: Store) -> Pending:
        if self.wheels.off(store) or self.wheels.complete(store):
            return Pending(self.name)
        if self.wheels.built() is None:
            return Pending(self.name, 1, 0, "not built yet (pip download, then upload)")
        missing = self.wheels.missing(store, self.roles)
        index = 1 if self.writes_index else 0
        return Pending(self.name, len(missing) + index, sum(w.size for w in missing),
                       f"{len(missing)} wheel(s) to upload")

    def stage(self, store: Store, throttle: Throttle, stop: threading.Event) -> None:
        if self.wheels.off(store) or self.wheels.complete(store):
            return
        self.wheels.build(store)
        for wheel in sorted(self.wheels.missing(store, self.roles), key=lambda w: w.size):
            if stop.is_set() or wheel.path is None:
                return
            if send_file(store, wheel.key, wheel.path, throttle, stop):
                self.wheels.present.add(store, wheel.key)
        if self.writes_index and not stop.is_set():
            self.wheels.put_index(store)


def wheel_parts(context: Context) -> list[Part]:
    """burst's wheel first (small, and no node starts without it), then the others."""
    wheels = Wheels(context)
    return [WheelPart(wheels, "burst-wheel", lambda role: role == "burst", False),
            WheelPart(wheels, "wheelhouse", lambda role: role != "burst", True)]


def code_parts(context: Context) -> list[Part]:
    return [CodePart(context)]


def input_parts(context: Context) -> list[Part]:
    """The run's data set and hub caches (:mod:`burst.inputs.part`), when it declared or
    read any: from then on staged here, throttled, instead of by the freeze."""
    return list(inputs_part.for_run(context.run_id))


Factory = Callable[[Context], list[Part]]
# what makes a run's parts, in staging order
FACTORIES: list[Factory] = [code_parts, wheel_parts, input_parts]


def parts_for(context: Context) -> list[Part]:
    return [part for factory in FACTORIES for part in factory(context)]

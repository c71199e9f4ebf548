"""A run frozen the way ``burst freeze`` leaves it: a lockfile and a wheelhouse of real
(tiny, hand-built) wheels uploaded through the wheelhouse's own upload."""

from __future__ import annotations

import hashlib
from pathlib import Path

from burst.env import lockfile, wheelhouse
from burst.env.lockfile import Package
from burst.store.base import Store
from tests.helpers.env_helpers import build_wheel, tiny_lockfile


def frozen_run(store: Store, run_id: str, tmp: Path) -> list[wheelhouse.Wheel]:
    """Freeze ``run_id`` into ``store`` with two wheels (alpha, beta); return them."""
    lock = tiny_lockfile(Package("alpha", "1.0"), Package("beta", "2.0"))
    lockfile.save(store, run_id, lock)
    wheels = []
    for name, version in (("alpha", "1.0"), ("beta", "2.0")):
        path = build_wheel(tmp / "wheels", name, version, "VALUE = 1\n")
        data = path.read_bytes()
        wheels.append(wheelhouse.Wheel(name, version, path.name, hashlib.sha256(data).hexdigest(),
                                       len(data), "dependency", path=path))
    house = wheelhouse.Wheelhouse(wheelhouse.Target("3.11"), wheels)
    wheelhouse.upload(store, run_id, lock.digest, house)
    return wheels

"""The generators' state: captured as copies, stored as tensors, restored exactly, and the
lists that older snapshots hold still restore."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import tree
from burst.state import capture as state_mod
from burst.state import rng


def draws() -> tuple:
    return (random.random(), float(np.random.rand()), float(np.random.standard_normal()),
            torch.rand(3).tolist())


def through_json(state: dict) -> dict:
    """``state`` as a snapshot holds it and reads it back: JSON tree plus tensor bytes."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = json.loads(json.dumps(tree.encode(state, "rng", tensors)))
    stored = {name: t.clone() for name, t in tensors.items()}
    return tree.decode(encoded, stored.__getitem__)


def test_a_restored_capture_replays_every_generator_exactly():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.standard_normal()  # leaves a cached Gaussian: part of NumPy's state
    state = through_json(rng.storable(rng.capture()))
    expected = draws()
    draws()
    rng.restore(state)
    assert draws() == expected


def test_a_snapshot_holds_the_generator_keys_as_tensors_not_numbers():
    model = torch.nn.Linear(2, 1)
    encoded, tensors = state_mod.capture(state_mod.Components(model), extra={})
    python_key = tensors["state/rng/python/1"]
    numpy_key = tensors["state/rng/numpy/1"]
    assert python_key.dtype == numpy_key.dtype == torch.int64
    assert (python_key.numel(), numpy_key.numel()) == (625, 624)
    assert len(json.dumps(encoded["rng"])) < 500  # a few references, not 1,249 integers


def test_an_older_snapshots_keys_as_lists_still_restore():
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    old_format = {"python": random.getstate(),  # what snapshots held before tensor keys
                  "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
                  "torch": torch.get_rng_state()}
    state = through_json(old_format)
    assert isinstance(state["numpy"][1], list) and isinstance(state["python"][1], tuple)
    expected = draws()
    rng.check(state)
    rng.restore(state)
    assert draws() == expected


def test_boundary_captures_follow_numpy_draws_and_its_cached_gaussian():
    np.random.seed(3)
    boundary = rng.Boundary()
    first = boundary.capture()
    assert boundary.capture()["numpy"] is first["numpy"]  # unchanged: not read again
    np.random.standard_normal()  # draws a pair: one is cached
    with_cache = boundary.capture()
    cached = float(np.random.standard_normal())  # uses the cache: the key does not move
    after = boundary.capture()
    following = float(np.random.standard_normal())
    rng.restore(with_cache)
    assert float(np.random.standard_normal()) == cached
    rng.restore(after)
    assert float(np.random.standard_normal()) == following
    rng.restore(first)
    np.random.standard_normal()
    assert float(np.random.standard_normal()) == cached


def test_boundary_captures_follow_python_draws_and_its_cached_gaussian():
    random.seed(4)
    boundary = rng.Boundary()
    first = boundary.capture()
    assert boundary.capture()["python"][1] is first["python"][1]  # unchanged: not read again
    assert boundary.capture()["python"] == random.getstate()
    random.gauss()  # draws a pair: one is kept in gauss_next, outside the key
    with_cache = boundary.capture()
    assert with_cache["python"] == random.getstate()
    cached = random.gauss()  # uses gauss_next: the key does not move
    after = boundary.capture()
    assert after["python"] == random.getstate()
    following = random.gauss()
    rng.restore(with_cache)
    assert random.gauss() == cached
    rng.restore(after)
    assert random.gauss() == following
    rng.restore(first)
    assert boundary.capture()["python"] == first["python"]


def test_boundary_follows_a_generator_installed_in_place_of_pythons_global_one(monkeypatch):
    class Seeded(random.Random):
        """A user's generator whose methods replace the module's functions."""

    replacement = Seeded(5)
    boundary = rng.Boundary()
    boundary.capture()
    monkeypatch.setattr(random, "getstate", replacement.getstate)
    first = boundary.capture()["python"]
    assert first == replacement.getstate()
    replacement.random()
    assert boundary.capture()["python"] == replacement.getstate() != first


@pytest.mark.parametrize("part, bad", [("python", torch.zeros(2, 625, dtype=torch.int64)),
                                       ("numpy", torch.full((624,), -1, dtype=torch.int64))])
def test_a_malformed_stored_key_is_refused_before_anything_changes(part, bad):
    state = rng.storable(rng.capture())
    if part == "python":
        state["python"] = (state["python"][0], bad, state["python"][2])
    else:
        state["numpy"] = [state["numpy"][0], bad, *state["numpy"][2:]]
    before = random.getstate(), np.random.get_state(legacy=True)[1].tolist()
    with pytest.raises(SnapshotError, match="RNG state is malformed"):
        rng.check(state)
    assert (random.getstate(), np.random.get_state(legacy=True)[1].tolist()) == before

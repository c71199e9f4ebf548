"""The two shadow buffer sets of :class:`burst.snapshot.tiers.Tiers` and their states: a
capture never overwrites the latest capture while the other set can take it."""

from __future__ import annotations

import torch

from burst.snapshot.tiers import SetState, Tiers
from burst.store import LocalStore


def _capture(shadow: Tiers, step: int):
    live = {"weight": torch.full((4,), float(step))}
    return shadow.capture(step, {"weight": {"$tensor": "weight"}}, live, {"reason": "test"})


def test_a_first_capture_is_the_latest_and_the_other_set_stays_free(tmp_path):
    shadow = Tiers(LocalStore(tmp_path), "run")
    first = _capture(shadow, 1)
    assert shadow.state_of(first.buffers) is SetState.LATEST


def test_the_next_capture_takes_the_other_set_and_frees_the_older_one(tmp_path):
    shadow = Tiers(LocalStore(tmp_path), "run")
    first = _capture(shadow, 1)
    second = _capture(shadow, 2)
    assert second.buffers is not first.buffers
    assert (shadow.state_of(first.buffers), shadow.state_of(second.buffers)) == (
        SetState.FREE, SetState.LATEST)
    assert torch.equal(second.tensors["weight"], torch.full((4,), 2.0))

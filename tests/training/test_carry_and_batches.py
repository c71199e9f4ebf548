"""``attach(carry=...)`` and ``run.batches``, in one process: what comes back, and where."""

from __future__ import annotations

import pytest
import torch

import burst
from burst.errors import ConfigError


def make_run(tmp_path, run_id: str = "carry") -> burst.Run:
    return burst.Run(run_id, store=tmp_path / "store", global_batch=2, micro_batch=1,
                     persist_every=1, persist_seconds=None)


def test_carried_tensors_come_back_into_the_tensors_given(tmp_path):
    model = torch.nn.Linear(2, 1)
    run = make_run(tmp_path)
    ema = {"w": torch.zeros(3)}
    run.attach(model, carry={"ema": ema, "level": 0})
    for step in run.batches(lambda: torch.ones(1), steps=2):
        for _ in step:
            pass
        ema["w"].add_(1.5)  # in place: the dict holds the same tensor
        run.carry["level"] += 1
    run.close()

    given = {"w": torch.full((3,), -1.0)}
    again = make_run(tmp_path)
    carry = {"ema": given, "level": 0}
    again.attach(torch.nn.Linear(2, 1), carry=carry)
    assert again.carry is carry and carry["ema"] is given
    assert torch.equal(given["w"], torch.full((3,), 3.0)) and carry["level"] == 2


def test_a_carried_key_the_snapshot_lacks_keeps_its_value_and_is_noted(tmp_path):
    run = make_run(tmp_path)
    run.attach(torch.nn.Linear(2, 1), carry={"a": 1})
    run.close()
    again = make_run(tmp_path)
    report = again.attach(torch.nn.Linear(2, 1), carry={"a": 0, "b": torch.ones(2)})
    assert again.carry["a"] == 1 and torch.equal(again.carry["b"], torch.ones(2))
    assert "carry b not in the snapshot" in str(report)


def test_a_carried_value_no_snapshot_can_hold_is_refused_at_attach(tmp_path):
    with pytest.raises(ConfigError, match="cannot snapshot a object"):
        make_run(tmp_path).attach(torch.nn.Linear(2, 1), carry={"bad": object()})


def test_batches_are_drawn_without_moving_the_global_generators(tmp_path):
    torch.manual_seed(3)
    run = make_run(tmp_path)
    run.attach(torch.nn.Linear(2, 1))
    before = torch.get_rng_state()
    drawn = [x for step in run.batches(lambda: torch.randint(100, (4,)), steps=2)
             for x in step]
    assert torch.equal(torch.get_rng_state(), before)
    assert len(drawn) == 4 and not all(torch.equal(drawn[0], x) for x in drawn[1:])


def test_batches_need_the_run_attached_first(tmp_path):
    with pytest.raises(ConfigError, match="attach"):
        next(iter(make_run(tmp_path).batches(lambda: torch.ones(1))))

"""In-process memory re-plan: a modelled card drives the micro-batch down before it runs out
and back up with headroom, while every step trains on exactly the unchanged run's samples."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.errors import ConfigError
from burst.training import checkpointing
from burst.training.memory_control import Reading, split_batch

DATA = TensorDataset(torch.linspace(-1, 1, 96 * 3).reshape(96, 3), torch.arange(96))
CARD = 1000  # bytes on the modelled card
SLOPE = 50  # bytes per sample of a micro-batch


def static_bytes(step: int) -> int:
    """Other tenants and fragmentation: rises mid-run, then goes away."""
    if step <= 3:
        return 300
    if step == 4:
        return 420
    if step <= 6:
        return 540
    if step <= 10:
        return 640  # micro-batch 8 would need 1040 bytes here: more than the card
    return 200


class Card:
    """The card as the run sees it: each step's peak is static + slope x micro-batch."""

    def __init__(self) -> None:
        self.run: burst.Run | None = None
        self.peaks: list[int] = []

    def __call__(self) -> Reading:
        assert self.run is not None
        peak = static_bytes(self.run.step) + SLOPE * self.run.micro_batch
        self.peaks.append(peak)
        return Reading(peak, CARD)


def train(tmp_path, name: str, card: Card | None = None, **kwargs
          ) -> tuple[burst.Run, list, list, dict]:
    """Train a tiny regression for two epochs; return the run, each step's sample indices
    and loss, and the final weights."""
    run = burst.Run(name, store=tmp_path / name, global_batch=8, micro_batch=8,
                    persist_seconds=None, memory_reader=card, **kwargs)
    if card is not None:
        card.run = run
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model, opt)
    loader = DataLoader(DATA, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(DATA, seed=3))
    seen, losses = [], []
    for _ in run.epochs(2):
        for step in run.steps(loader):
            indices, total = [], 0.0
            for x, y in step:
                loss = ((model(x).squeeze(1) - x.sum(1)) ** 2).mean() * step.weight(len(x))
                loss.backward()
                indices += y.tolist()
                total += loss.item()
            opt.step()
            opt.zero_grad()
            seen.append(indices)
            losses.append(total)
    run.close()
    return run, seen, losses, model.state_dict()


def replans(run: burst.Run) -> list[dict]:
    return [e for e in events.read(run.local, run.run_id) if e["event"] == "memory-replan"]


def test_the_run_shrinks_before_the_card_runs_out_and_grows_back_with_the_same_samples(tmp_path):
    card = Card()
    reference, ref_seen, ref_losses, ref_weights = train(tmp_path, "plain", memory_target=None)
    replanned, seen, losses, weights = train(tmp_path, "controlled", card)
    assert max(card.peaks) <= CARD  # never out of memory
    assert max(static_bytes(s) + SLOPE * 8 for s in range(1, 25)) > CARD  # unchanged would OOM
    changes = [(e["step"], e["reason"], e["old_micro"], e["new_micro"], e["new_accumulation"])
               for e in replans(replanned)]
    assert changes == [(5, "over-target", 8, 4, 2), (13, "headroom", 4, 8, 1)]
    assert replans(replanned)[1]["predicted_bytes"] <= 0.85 * CARD
    assert seen == ref_seen and len(seen) == 24
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-7)
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6)
    assert reference.micro_batch == replanned.micro_batch == 8


def test_an_alert_shrinks_one_size_without_a_reading(tmp_path):
    run = burst.Run("alert", store=tmp_path, global_batch=8, micro_batch=8, persist_seconds=None,
                    memory_reader=lambda: None)
    run.attach(torch.nn.Linear(3, 1))
    loader = DataLoader(DATA, batch_size=8, sampler=burst.ResumableSampler(DATA))
    sizes = []
    for _ in run.epochs(1):
        for step in run.steps(loader):
            sizes.append([len(x) for x, _ in step])
            if step.index == 2:
                run.memory_alert()
    run.close()
    assert sizes[:2] == [[8], [8]] and all(s == [4, 4] for s in sizes[2:])
    (event,) = replans(run)
    assert (event["reason"], event["old_micro"], event["new_micro"]) == ("alert", 8, 4)


def test_a_memory_rule_switches_amp_once_past_its_threshold(tmp_path):
    fractions = iter([0.5, 0.81, 0.9, 0.95] + [0.5] * 20)
    run = burst.Run("rule", store=tmp_path, global_batch=8, micro_batch=8, persist_seconds=None,
                    memory_rules=["memory > 80%: amp=bf16"], memory_target=0.99,
                    memory_reader=lambda: Reading(int(next(fractions) * CARD), CARD))
    run.attach(torch.nn.Linear(3, 1))
    loader = DataLoader(DATA, batch_size=8, sampler=burst.ResumableSampler(DATA))
    amps = []
    for _ in run.epochs(1):
        for step in run.steps(loader):
            amps.append(run.amp)
            for _batch in step:
                pass
    run.close()
    assert amps[:3] == [None, None, "bf16"]
    rules = [e for e in events.read(run.local, "rule") if e["event"] == "memory-rule"]
    assert [(e["step"], e["new"]) for e in rules] == [(2, "bf16")]


def test_a_bad_memory_rule_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match="expected 'memory > N%: key=value'"):
        burst.Run("bad", store=tmp_path, global_batch=8, memory_rules=["memory 80: amp"])


def test_activation_checkpointing_keeps_the_gradients():
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.tanh(self.inner(x))

    def grads(wrap: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(3, 1))
        if wrap:
            assert checkpointing.wrap(model, ["Block"]) == ["0", "1"]
        model(DATA.tensors[0][:8]).sum().backward()
        return [p.grad for p in model.parameters()]

    for a, b in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(a, b)


def test_a_collated_batch_splits_field_by_field():
    batch = {"x": torch.arange(6).reshape(3, 2), "names": ["a", "b", "c"],
             "pair": [torch.arange(3), torch.arange(3) * 2]}
    first, second = split_batch(batch, 2)
    assert first["names"] == ["a", "b"] and second["names"] == ["c"]
    assert first["x"].tolist() == [[0, 1], [2, 3]] and second["pair"][1].tolist() == [4]


def test_a_checkpointing_rule_wraps_the_named_modules_at_a_boundary(tmp_path):
    fractions = iter([0.5, 0.95] + [0.5] * 20)
    run = burst.Run("ckpt", store=tmp_path, global_batch=8, micro_batch=8, persist_seconds=None,
                    memory_rules=["memory > 90%: activation_checkpointing=Linear"],
                    memory_target=0.99,
                    memory_reader=lambda: Reading(int(next(fractions) * CARD), CARD))
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
    run.attach(model)
    loader = DataLoader(DATA, batch_size=8, sampler=burst.ResumableSampler(DATA))
    for _ in run.epochs(1):
        for step in run.steps(loader):
            for x, _ in step:
                model(x).sum().backward()
    run.close()
    rules = [e for e in events.read(run.local, "ckpt") if e["event"] == "memory-rule"]
    assert [(e["step"], e["modules"]) for e in rules] == [(2, ["0", "2"])]
    assert hasattr(model[0].forward, "__wrapped__")  # the forward now runs checkpointed

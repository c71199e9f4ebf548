"""Mixed precision across a restore: the GradScaler is loaded, dropped or started fresh."""

from __future__ import annotations

import torch

import burst


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def trained_scaler_snapshot(tmp_path, amp: str | None, enabled: bool) -> dict:
    """Take a snapshot whose GradScaler went through real steps; return its state."""
    model, opt = model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=1, enabled=enabled)
    run = burst.Run("r", store=tmp_path, global_batch=1, amp=amp)
    run.attach(model, opt, scaler=scaler)
    for _ in range(3):
        scaler.scale(model(torch.ones(1, 3)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    run.snapshot(wait=True)
    return scaler.state_dict()


def restore_with(tmp_path, amp: str | None, enabled: bool):
    model, opt = model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, enabled=enabled)
    report = burst.Run("r", store=tmp_path, global_batch=1, amp=amp).attach(model, opt,
                                                                          scaler=scaler)
    return scaler, report


def test_fp16_to_fp16_restores_the_scaler_exactly(tmp_path):
    saved = trained_scaler_snapshot(tmp_path, "fp16", enabled=True)
    scaler, report = restore_with(tmp_path, "fp16", enabled=True)
    assert saved["scale"] == 512.0  # grew three times: a real, non-default state
    assert scaler.state_dict() == saved and report.notes == []


def test_fp16_to_bf16_drops_the_scaler_state_and_says_so(tmp_path):
    trained_scaler_snapshot(tmp_path, "fp16", enabled=True)
    scaler, report = restore_with(tmp_path, "bf16", enabled=False)
    assert not scaler.is_enabled()
    assert any("GradScaler state dropped" in n for n in report.notes)
    assert any("precision fp16 -> bf16" in n for n in report.notes)


def test_bf16_to_fp16_starts_a_fresh_enabled_scaler(tmp_path):
    trained_scaler_snapshot(tmp_path, "bf16", enabled=False)  # a disabled scaler saves {}
    scaler, report = restore_with(tmp_path, "fp16", enabled=True)
    assert scaler.is_enabled() and scaler.get_scale() == 2.0  # fresh, never fed {}
    assert any("GradScaler starts fresh" in n for n in report.notes)


def test_an_enabled_scaler_left_on_under_bf16_is_not_fed_an_fp16_scale(tmp_path):
    trained_scaler_snapshot(tmp_path, "fp16", enabled=True)
    scaler, report = restore_with(tmp_path, "bf16", enabled=True)
    assert scaler.get_scale() == 2.0
    assert any("GradScaler state dropped" in n for n in report.notes)

"""Plans for one target: layout, precision, memory, time; and the errors when there is none."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.plan import cards as gpus
from burst.plan.planner import Options, PlanError, Target, check_split, micro_batches, plan_for
from burst.state.amp import parse_amp
from tests.helpers.plan_helpers import GIB, facts

CATALOG = gpus.builtin()


def target(card: str, count: int = 1, nodes: int = 1) -> Target:
    return Target(CATALOG.get(card), count, nodes)


@pytest.mark.parametrize(
    "card, count, nodes, static, slope, global_batch, micro, accumulation, amp", [
        ("T4", 1, 1, 4, 0.5, 64, 16, 4, "fp16"),
        ("A10G", 1, 1, 4, 0.5, 64, 16, 4, "bf16"),
        ("L40S", 1, 1, 4, 0.5, 64, 64, 1, "bf16"),
        ("A100", 2, 1, 4, 0.5, 64, 32, 1, "bf16"),
        ("V100", 4, 1, 8, 1, 64, 2, 8, "fp16"),
        ("H100", 8, 2, 20, 2, 512, 16, 2, "bf16"),
        ("L4", 1, 1, 4, 1, 96, 12, 8, "bf16"),
        ("B200", 1, 1, 100, 4, 1000, 10, 100, "bf16"),
    ])
def test_plan_takes_the_largest_micro_batch_that_fits_and_keeps_the_global_batch(
        card, count, nodes, static, slope, global_batch, micro, accumulation, amp):
    run = facts(static_gib=static, slope_gib=slope, global_batch=global_batch)
    plan = plan_for(run, target(card, count, nodes))
    assert (plan.micro_batch, plan.accumulation, plan.amp) == (micro, accumulation, amp)
    assert plan.micro_batch * plan.accumulation * plan.world_size == global_batch
    assert plan.peak_bytes <= plan.budget_bytes <= 0.85 * CATALOG.get(card).memory_bytes


def test_micro_batches_are_exactly_the_splits_of_the_per_gpu_batch():
    assert micro_batches(48, 2) == [24, 12, 8, 6, 4, 3, 2, 1]


@pytest.mark.parametrize("card, amp, scaler, tf32", [
    ("T4", "fp16", True, False), ("V100", "fp16", True, False),
    ("A10G", "bf16", False, True), ("H100", "bf16", False, True), ("RTX3090", "bf16", False, True),
])
def test_bf16_where_the_card_has_it_else_fp16_with_a_grad_scaler_and_tf32_from_ampere(
        card, amp, scaler, tf32):
    plan = plan_for(facts(static_gib=1, slope_gib=0.01), target(card))
    assert (plan.amp, plan.grad_scaler, plan.tf32) == (amp, scaler, tf32)


def test_switching_a_bf16_run_to_fp16_says_so():
    plan = plan_for(facts(static_gib=1, slope_gib=0.01, amp="bf16"), target("T4"))
    assert any("bf16 -> fp16" in note for note in plan.notes)


def test_keeping_bf16_on_a_card_without_it_is_refused():
    with pytest.raises(PlanError, match="T4 has no bf16"):
        plan_for(facts(amp="bf16"), target("T4"), Options(amp="keep"))


def test_full_precision_policy_keeps_fp32_with_tf32_matmuls_on_ampere():
    plan = plan_for(facts(static_gib=1, slope_gib=0.01, amp=None), target("A100"),
                    Options(amp="none"))
    assert plan.amp is None and plan.tf32 and not plan.grad_scaler
    assert any("TF32" in note for note in plan.notes)


def test_a_larger_margin_admits_a_larger_micro_batch():
    run = facts(static_gib=4, slope_gib=0.5)
    tight = plan_for(run, target("A10G"), Options(margin=0.6))
    loose = plan_for(run, target("A10G"), Options(margin=1.0))
    assert tight.micro_batch < loose.micro_batch
    assert tight.peak_bytes <= 0.6 * CATALOG.get("A10G").memory_bytes


def test_unsplittable_global_batch_is_a_one_line_error_naming_the_nearest_layouts():
    with pytest.raises(PlanError) as error:
        plan_for(facts(global_batch=30), target("A100", count=4))
    message = str(error.value)
    assert "\n" not in message and "cannot be split evenly over 4 GPUs" in message
    assert "never changes the global batch" in message
    assert error.value.choices == {"world_sizes": [3, 5], "global_batches": [28, 32]}


def test_split_choices_are_real_splits():
    with pytest.raises(PlanError) as error:
        check_split(100, 3, 2)
    assert all(100 % w == 0 for w in error.value.choices["world_sizes"])
    assert all(b % 6 == 0 for b in error.value.choices["global_batches"])


def test_activations_that_do_not_fit_even_at_micro_batch_1_suggest_checkpointing_or_more_gpus():
    with pytest.raises(PlanError) as error:
        plan_for(facts(static_gib=4, slope_gib=15), target("T4"))
    message = str(error.value)
    assert "\n" not in message and "fits nowhere on T4" in message
    assert "even micro-batch 1" in message
    assert "activation checkpointing" in message and "more GPUs" in message


def test_weights_and_optimizer_state_too_big_for_the_card_suggest_sharding_or_a_bigger_card():
    with pytest.raises(PlanError) as error:
        plan_for(facts(static_gib=30, slope_gib=0.1), target("L4"))
    message = str(error.value)
    assert "\n" not in message and "alone need 30.0 GiB" in message
    assert "bigger card" in message and "FSDP" in message


def test_unknown_activations_start_at_the_old_micro_batch_and_probe_every_split():
    plan = plan_for(facts(slope_gib=None, micro=8, global_batch=64), target("A100"))
    assert plan.probe and plan.peak_bytes is None
    assert plan.micro_batch == 8 and plan.accumulation == 8
    assert plan.probe_micro_batches == (64, 32, 16, 8, 4, 2, 1)
    assert plan.to_env()["BURST_PROBE"] == "1"
    assert any("probes" in note for note in plan.notes)


def test_a_predicted_plan_lets_the_probe_confirm_from_its_own_micro_batch_down():
    plan = plan_for(facts(static_gib=4, slope_gib=0.5), target("A10G"))
    assert not plan.probe and plan.probe_micro_batches == (16, 8, 4, 2, 1)


def test_env_carries_the_whole_plan_in_a_form_run_reads():
    plan = plan_for(facts(static_gib=4, slope_gib=0.5), target("T4", count=2))
    env = plan.to_env()
    assert env == {"BURST_MICRO_BATCH": "16", "BURST_ACCUMULATION": "2",
                   "BURST_WORLD_SIZE": "2", "BURST_AMP": "fp16", "BURST_GRAD_SCALER": "1",
                   "BURST_TF32": "0", "BURST_PROBE": "0",
                   "BURST_PROBE_MICRO_BATCHES": "16,8,4,2,1"}
    assert parse_amp(env["BURST_AMP"]) == "fp16"
    assert parse_amp(plan_for(facts(amp=None), target("A100"), Options(amp="none"))
                     .to_env()["BURST_AMP"]) is None


def test_time_to_finish_scales_the_measured_rate_by_tflops_and_gpu_count():
    run = facts(static_gib=1, slope_gib=0.01, steps_per_second=1.0, step=1000,
                total_steps=4600, amp="bf16")
    old = CATALOG.get("RTX4090")
    one = plan_for(run, target("H100"), old_card=old)
    assert one.steps_per_second == pytest.approx(989 / 165.2)
    assert one.seconds_to_finish == pytest.approx(3600 / (989 / 165.2))
    two = plan_for(run, target("H100", count=2), old_card=old)
    assert two.steps_per_second == pytest.approx(2 * 0.9 * 989 / 165.2)


def test_no_time_prediction_without_a_measured_rate_or_a_known_old_card():
    run = facts(steps_per_second=None, total_steps=100)
    assert plan_for(run, target("H100"), old_card=CATALOG.get("L4")).seconds_to_finish is None
    run = facts(steps_per_second=2.0, total_steps=100, card="cpu")
    assert plan_for(run, target("H100"), old_card=None).seconds_to_finish is None


@pytest.mark.parametrize("options", [{"margin": 0}, {"margin": 1.5}, {"amp": "fp8"},
                                     {"spot": "sometimes"}])
def test_bad_options_are_config_errors(options):
    with pytest.raises(ConfigError):
        Options(**options)


def test_peak_budget_excludes_a_reserve_for_the_cuda_context():
    plan = plan_for(facts(static_gib=1, slope_gib=0.01), target("L4"))
    assert plan.budget_bytes == int(24 * GIB * 0.85) - (512 << 20)

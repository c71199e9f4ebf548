"""The memory model: exact static bytes from a snapshot, activations fitted from peaks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from burst.errors import SnapshotError
from burst.plan import memory
from burst.state import capture as state_mod
from tests.helpers.plan_helpers import GIB, manifest, tensor_index

STATIC = memory.Static(params=2 * GIB, grads=2 * GIB, optimizer=4 * GIB)


def test_static_bytes_are_exact_for_a_real_model_and_adam_state():
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    _, live = state_mod.capture(state_mod.Components(model, optimizer), {})
    tensors = {name: {"dtype": str(t.dtype).removeprefix("torch."),
                      "nbytes": t.numel() * t.element_size()} for name, t in live.items()}
    static = memory.static_bytes(tensors)
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert static.params == param_bytes + buffer_bytes
    assert static.grads == param_bytes
    assert static.optimizer == 2 * param_bytes + steps


def test_gradients_follow_the_optimizers_parameters_not_frozen_weights():
    tensors, _ = tensor_index(
        {"frozen": ([1_000_000], "bfloat16"), "lora": ([1000], "float32")},
        {0: {"exp_avg": ([1000], "float32"), "exp_avg_sq": ([1000], "float32")}})
    static = memory.static_bytes(tensors)
    assert static.grads == 4000
    assert static.params == 2_000_000 + 4000


def test_without_optimizer_state_every_float_weight_but_batchnorm_statistics_gets_a_gradient():
    tensors, _ = tensor_index({"w": ([100], "float32"), "bn.running_mean": ([10], "float32"),
                               "bn.num_batches_tracked": ([], "int64")})
    assert memory.static_bytes(tensors).grads == 400


@pytest.mark.parametrize("intercept_gib, slope_mib, sizes", [
    (8, 300, (4, 8, 16)), (1.5, 12, (1, 32)), (40, 2048, (2, 3, 5, 7)),
])
def test_fit_recovers_slope_and_intercept_from_synthetic_peaks(intercept_gib, slope_mib, sizes):
    intercept, slope = intercept_gib * GIB, slope_mib * (1 << 20)
    model = memory.fit(STATIC, {m: int(intercept + slope * m) for m in sizes})
    assert model.slope == pytest.approx(slope, rel=1e-9)
    assert model.intercept == pytest.approx(intercept, abs=2)


@given(intercept=st.integers(0, 200 * GIB), slope=st.integers(0, 8 * GIB),
       sizes=st.lists(st.integers(1, 512), min_size=2, max_size=6, unique=True))
def test_fit_recovers_any_line_through_its_peaks(intercept, slope, sizes):
    model = memory.fit(STATIC, {m: intercept + slope * m for m in sizes})
    assert model.slope == pytest.approx(slope, rel=1e-6, abs=1e-3)
    assert model.intercept == pytest.approx(intercept, rel=1e-6, abs=2)


def test_noisy_fit_never_predicts_less_than_a_recorded_peak():
    peaks = {4: 10 * GIB, 8: 11 * GIB + (300 << 20), 16: 14 * GIB}
    model = memory.fit(STATIC, peaks)
    for micro, peak in peaks.items():
        assert model.predict(micro) >= peak


def test_peaks_that_shrink_with_the_micro_batch_give_no_negative_slope():
    model = memory.fit(STATIC, {4: 12 * GIB, 8: 11 * GIB})
    assert model.slope == 0 and model.predict(64) >= 12 * GIB


def test_one_recorded_size_takes_the_static_part_as_intercept():
    model = memory.fit(STATIC, {16: STATIC.total + 16 * (100 << 20)})
    assert model.intercept == STATIC.total
    assert model.slope == 100 << 20


def test_no_recorded_size_means_the_plan_must_probe():
    model = memory.fit(STATIC, {})
    assert model.needs_probe and model.predict(8) is None
    assert model.fixed(None, 1) == STATIC.total


def test_data_parallel_adds_gradient_buckets_the_size_of_the_gradients():
    model = memory.fit(STATIC, {8: 16 * GIB})
    assert model.predict(8, world_size=4) - model.predict(8) == STATIC.grads


def test_autocast_from_an_fp32_run_adds_16_bit_weight_copies():
    static = memory.Static(params=4 * GIB, grads=4 * GIB, optimizer=8 * GIB,
                           float32_params=4 * GIB)
    model = memory.fit(static, {8: 20 * GIB}, amp=None)
    assert model.predict(8, amp="bf16") - model.predict(8, amp=None) == 2 * GIB


def test_fp32_after_16_bit_doubles_the_activations():
    model = memory.fit(STATIC, {8: STATIC.total + 8 * GIB}, amp="bf16")
    assert model.predict(8, amp=None) - model.predict(8, amp="bf16") == 8 * GIB


def test_from_manifest_uses_its_tensors_peaks_precision_and_world_size():
    data = manifest(n_params=1000, peaks={8: 1_000_000, 16: 1_500_000}, amp="fp16", world=2,
                    global_batch=64)
    model = memory.from_manifest(data)
    assert model.static.params == 4000 and model.static.optimizer == 8004
    assert model.slope == pytest.approx(62_500)
    assert (model.amp, model.world_size) == ("fp16", 2)


def test_a_malformed_peak_entry_is_a_snapshot_error():
    data = manifest()
    data["memory"]["peak_bytes_by_micro_batch"] = {"eight": 123}
    with pytest.raises(SnapshotError, match="malformed"):
        memory.from_manifest(data)


# -- a sharded (FSDP) run: its state is counted per rank ----------------------------------


def _sharded_model(world: int, peak_gib: float) -> memory.MemoryModel:
    data = manifest(n_params=1 << 28, peaks={4: int(peak_gib * GIB)}, world=world,
                    global_batch=64, micro=4)
    data["batch"]["sharded"] = True
    return memory.from_manifest(data)


def test_a_sharded_snapshot_counts_its_state_per_rank():
    model = _sharded_model(4, peak_gib=2.0)
    total = model.static.total  # 1 Gi elements of float32 weights + Adam: 3 GiB + grads
    assert model.sharded
    assert model.fixed(None, 4) == pytest.approx(total / 4, rel=0.01)


def test_a_sharded_run_on_more_ranks_needs_less_per_gpu():
    model = _sharded_model(4, peak_gib=2.0)
    quarter, eighth = model.fixed(None, 4), model.fixed(None, 8)
    assert eighth == pytest.approx(quarter - model.static.total / 8, rel=0.01)


def test_a_sharded_run_on_fewer_ranks_needs_more_per_gpu_and_no_ddp_buckets():
    model = _sharded_model(4, peak_gib=2.0)
    assert model.fixed(None, 1) == pytest.approx(model.static.total, rel=0.01)


def test_a_replicated_snapshot_still_counts_the_whole_state_on_every_gpu():
    data = manifest(n_params=1 << 28, peaks={4: 5 * GIB}, world=4, global_batch=64, micro=4)
    model = memory.from_manifest(data)
    assert not model.sharded
    assert model.fixed(None, 8) == model.fixed(None, 4)

"""The OOM-backoff probe a new node runs to confirm (or find) its micro-batch."""

from __future__ import annotations

import weakref

import pytest
import torch

from burst.contract import ENV_PROBE_MICRO_BATCHES
from burst.errors import BurstError, ConfigError
from burst.plan.probe import find_micro_batch, is_oom, sizes_from_env


def fake_step(limit: int, tried: list[int]):
    """A step that raises a real CUDA OOM error above ``limit`` samples."""
    def step(size: int) -> None:
        tried.append(size)
        if size > limit:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size} GiB")
    return step


def test_probe_backs_off_on_cuda_oom_to_the_first_size_that_runs():
    tried: list[int] = []
    result = find_micro_batch(fake_step(6, tried), [32, 16, 8, 4, 2, 1])
    assert result.micro_batch == 4 and result.failed == (32, 16, 8)
    assert tried == [32, 16, 8, 4]


def test_runtime_errors_that_say_out_of_memory_count_as_oom():
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried..."))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_errors_that_are_not_oom_propagate():
    def step(size: int) -> None:
        raise ValueError("a bug in the training step")
    with pytest.raises(ValueError, match="a bug"):
        find_micro_batch(step, [8, 4])


def test_oom_at_every_size_is_a_one_line_error():
    with pytest.raises(BurstError) as error:
        find_micro_batch(fake_step(0, []), [4, 2, 1])
    assert "\n" not in str(error.value) and "activation checkpointing" in str(error.value)


def test_the_failed_attempts_tensors_are_freed_before_the_next_try():
    held: list[weakref.ref] = []

    def step(size: int) -> None:
        if held:
            assert held[-1]() is None, "the OOM'd attempt still holds its tensors"
        activations = torch.empty(size * 1000)
        held.append(weakref.ref(activations))
        if size > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    assert find_micro_batch(step, [4, 2, 1]).micro_batch == 1


def test_probe_sizes_come_from_the_plans_environment():
    assert sizes_from_env({ENV_PROBE_MICRO_BATCHES: "16,8,4"}) == [16, 8, 4]
    assert sizes_from_env({}) == []
    with pytest.raises(ConfigError):
        sizes_from_env({ENV_PROBE_MICRO_BATCHES: "16,eight"})


def test_nothing_to_probe_is_an_error():
    with pytest.raises(ConfigError):
        find_micro_batch(lambda size: None, [])

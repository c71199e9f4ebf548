"""The CUDA generator's restore, and NVML's view of the card."""

from __future__ import annotations

import pytest
import torch

from burst.state import rng
from burst.supervise.gpuwatch import Nvml
from tests.gpu.common import MARKS

pytestmark = MARKS


def test_restored_cuda_rng_draws_the_same_numbers():
    torch.cuda.manual_seed(11)
    torch.rand(7, device="cuda")
    saved = rng.storable(rng.capture())
    first = torch.rand(1000, device="cuda")
    torch.cuda.manual_seed(999)
    rng.restore(saved)
    assert torch.equal(torch.rand(1000, device="cuda"), first)


def test_nvml_sees_an_allocation_of_a_gibibyte():
    try:
        nvml = Nvml()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    index = torch.cuda.current_device()
    before = nvml.sample()[index]
    block = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    after = nvml.sample()[index]
    nvml.close()
    del block
    torch.cuda.empty_cache()
    assert after.memory_total == torch.cuda.mem_get_info()[1]
    assert after.memory_used - before.memory_used >= 1 << 30

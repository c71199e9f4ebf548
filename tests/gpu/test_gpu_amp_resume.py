"""bf16 and fp16 + GradScaler on CUDA: a run SIGKILLed mid-step and resumed from its
snapshot continues bit for bit (losses, samples) like the run that was never killed.
Dropout draws from the CUDA generator, so this also checks its restore."""

from __future__ import annotations

import pytest

from tests.gpu.common import MARKS, records, train

pytestmark = MARKS


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_a_killed_amp_run_resumes_bit_for_bit(amp, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir()
    killed.mkdir()
    done = train(whole, "amp", "--amp", amp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert train(killed, "amp", "--amp", amp, "--kill-at", "7").returncode == -9
    done = train(killed, "amp", "--amp", amp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert records(killed, "amp") == records(whole, "amp")

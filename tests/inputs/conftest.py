"""Fixtures for the inputs tests: a fresh recorder and parts registry for each test, and
a data set outside any project (a token file and a folder of small files)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from burst.inputs import part


@pytest.fixture(autouse=True)
def fresh_inputs(monkeypatch, tmp_path):
    """No run's inputs or recordings leak from one test into the next; no user config."""
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "no-config.toml"))
    for name in ("BURST_INPUTS", "BURST_INPUTS_MAX_BYTES", "BURST_HUB", "BURST_INPUTS_MAP",
                 "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TORCH_HOME",
                 "MODELSCOPE_CACHE", "HF_ENDPOINT", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    part.reset()
    yield
    part.reset()


@pytest.fixture
def dataset(tmp_path) -> Path:
    """``data/tokens.bin`` (2.5 chunks of bytes) and ``data/docs/`` (three small files)."""
    data = tmp_path / "data"
    (data / "docs").mkdir(parents=True)
    (data / "tokens.bin").write_bytes(random.Random(0).randbytes(20 << 20))
    for i in range(3):
        (data / "docs" / f"doc{i}.txt").write_text(f"document {i}\n" * 100)
    return data

"""The precision a run trains in, as the objects a loop uses: ``torch.autocast`` and a
``GradScaler`` that agree with the run's AMP setting (``BURST_AMP`` on a node, a memory
rule such as ``amp=bf16`` mid-run), so a loop written once follows a re-plan.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from burst.state.amp import AMP_DTYPES


def in_force(amp: str | None, scaler: Any) -> str | None:
    """The precision a snapshot records: the run's, or fp16 when the user manages an
    fp16 autocast themselves (an enabled scaler gives it away)."""
    if amp is None and scaler is not None and scaler.is_enabled():
        return "fp16"
    return amp


def grad_scaler(amp: str | None, model: torch.nn.Module | None) -> torch.amp.GradScaler:
    """A GradScaler that is enabled exactly when the precision needs one (fp16)."""
    return torch.amp.GradScaler(device_of(model), enabled=amp == "fp16")


def autocast(amp: str | None, model: torch.nn.Module | None,
             device_type: str | None = None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``amp`` (a no-op in full precision)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type or device_of(model), dtype=AMP_DTYPES[amp])


def device_of(model: torch.nn.Module | None) -> str:
    """The device type the model's parameters live on (else the one torch would use)."""
    if model is not None:
        for param in model.parameters():
            return param.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"

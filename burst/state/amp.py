"""Mixed precision across a resume: what happens to the GradScaler when the dtype changes.

fp16 needs a GradScaler; bf16 and fp32 do not. A snapshot taken under one and restored
under another must not feed a scaler state that does not belong to it: a disabled scaler
saves ``{}`` and an enabled scaler refuses ``{}`` on load, and an fp16 loss scale means
nothing to a bf16 run.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from burst.errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Scaler(Protocol):
    """What a resume asks of a loss scaler (``torch.amp.GradScaler``, or a framework's)."""

    def is_enabled(self) -> bool: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def parse_amp(value: str | None) -> str | None:
    """Normalise an AMP setting to ``"bf16"``, ``"fp16"`` or None (full precision)."""
    if value is None:
        return None
    given = value.strip().lower()
    aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp32": None,
               "float32": None, "none": None, "no": None, "off": None, "": None}
    name = aliases.get(given, given)
    if name is not None and name not in AMP_DTYPES:
        raise ConfigError(f"unknown AMP setting {value!r}: use bf16, fp16 or none")
    return name


def restore_scaler(scaler: Scaler | None, saved: dict | None, saved_amp: str | None,
                   amp: str | None) -> list[str]:
    """Load ``saved`` into ``scaler`` when that is meaningful; return what was changed."""
    if scaler is None:
        return [] if not saved else ["GradScaler state in the snapshot ignored: no scaler given"]
    enabled = bool(scaler.is_enabled())
    if not enabled:
        if saved:
            return [f"GradScaler state dropped: the scaler is disabled now ({_label(amp)})"]
        return []
    if not saved:
        if saved_amp == "fp16":
            return ["GradScaler starts fresh: the snapshot's scaler was disabled"]
        return [f"GradScaler starts fresh: the snapshot ran {_label(saved_amp)}, this run fp16"]
    if saved_amp != "fp16" or amp not in ("fp16", None):
        return [f"GradScaler state dropped: the snapshot ran {_label(saved_amp)}, "
                f"this run {_label(amp)}"]
    scaler.load_state_dict(saved)
    return []


def _label(amp: str | None) -> str:
    return amp or "fp32"

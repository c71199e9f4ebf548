"""Model-hub caches: where Hugging Face, torch hub and ModelScope keep what they download.

A run that loads pretrained weights reads them from a hub cache on this machine; a node
has an empty cache, and in mainland China often cannot reach the hub. So the files the
run read under a cache travel like any input (only those: a cache holds every model ever
downloaded), and the node gets the cache's variable (``HF_HOME``, ``TORCH_HOME``...)
pointing at the placed copy, so the hub library finds them there. When the user prefers a
hub mirror (``$BURST_HUB=mirror`` or ``[inputs] hub = "mirror"``) and names one
(``HF_ENDPOINT``, ``MODELSCOPE_DOMAIN``), the cache's files stay here and the mirror's
variable is forwarded to the node instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Hub:
    """One hub cache on this machine."""

    name: str  # huggingface, torch, modelscope
    env: str  # the variable that points the hub library at the cache (set on the node)
    root: str  # the cache directory here
    mirrors: tuple[str, ...] = ()  # variables that name a mirror of the hub


def caches(environ: Mapping[str, str] | None = None) -> list[Hub]:
    """The hub caches of this machine as the hub libraries resolve them."""
    env = os.environ if environ is None else environ
    xdg = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    found = []
    hf_hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if hf_hub:
        found.append(Hub("huggingface", "HF_HUB_CACHE", hf_hub, ("HF_ENDPOINT",)))
    found.append(Hub("huggingface", "HF_HOME", env.get("HF_HOME") or str(xdg / "huggingface"),
                     ("HF_ENDPOINT",)))
    found.append(Hub("torch", "TORCH_HOME", env.get("TORCH_HOME") or str(xdg / "torch")))
    found.append(Hub("modelscope", "MODELSCOPE_CACHE",
                     env.get("MODELSCOPE_CACHE") or str(xdg / "modelscope"),
                     ("MODELSCOPE_DOMAIN",)))
    return [Hub(h.name, h.env, os.path.abspath(os.path.expanduser(h.root)), h.mirrors)
            for h in found]


def hub_of(path: str, hubs: list[Hub]) -> Hub | None:
    """The cache ``path`` lies in (the innermost, so ``HF_HUB_CACHE`` beats ``HF_HOME``)."""
    inside = [h for h in hubs if path.startswith(h.root.rstrip("/") + "/")]
    return max(inside, key=lambda h: len(h.root)) if inside else None


def mirror_of(hub: Hub, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The mirror variables the user set for ``hub`` here (empty: no mirror named)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in hub.mirrors if env.get(name)}

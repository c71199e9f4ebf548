"""Nested training state <-> (JSON tree, flat tensor table), with no pickle anywhere.

``state_dict()`` results mix tensors with plain values in nested dicts, lists and tuples,
and some use non-string keys (an optimizer's state is keyed by parameter index). JSON
cannot hold all of that directly, so the few non-JSON shapes are tagged:

- a tensor becomes ``{"$tensor": name}`` and its data goes to the tensor table;
- a tuple becomes ``{"$tuple": [...]}`` (Adam's ``betas`` must come back as a tuple for the
  restored state to compare equal to the original);
- a dict with non-string keys becomes ``{"$dict": [[key, value], ...]}``;
- non-finite floats become ``{"$float": "inf" | "-inf" | "nan"}`` (strict JSON has none);
- a ``torch.dtype`` becomes ``{"$dtype": "float32"}``.

Decoding only ever builds dicts, lists, tuples, numbers, strings and tensors that the
caller supplies, so a hostile tree cannot make it run code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from burst.errors import SnapshotError

TAGS = ("$tensor", "$tuple", "$dict", "$float", "$dtype")
_PLAIN = frozenset({str, bool, int})  # exactly these types are their own JSON


def encode(value: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Return a JSON-able tree for ``value``; tensors are added to ``tensors`` under ``prefix/...``."""
    kind = type(value)  # the common kinds first: this runs at every shadow copy
    if kind in _PLAIN or value is None:
        return value
    if kind is dict:
        return _encode_mapping(value, prefix, tensors)
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value, prefix, tensors)
    if isinstance(value, np.ndarray):
        return _encode_tensor(torch.from_numpy(value.copy()), prefix, tensors)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return _encode_float(float(value))
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, f"{prefix}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{prefix}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return _encode_mapping(value, prefix, tensors)
    raise SnapshotError(
        f"cannot snapshot a {type(value).__name__} at {prefix!r}: "
        "only tensors, numbers, strings, lists, tuples and dicts are stored (no pickle)"
    )


def _encode_tensor(value: torch.Tensor, name: str, tensors: dict[str, torch.Tensor]) -> dict:
    if name in tensors:
        raise SnapshotError(f"two tensors would be stored under the same name {name!r}")
    tensors[name] = value
    return {"$tensor": name}


def _encode_float(value: float) -> float | dict:
    if math.isfinite(value):
        return value
    return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def _encode_mapping(value: Mapping, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    if all(isinstance(k, str) for k in value) and not any(k in TAGS for k in value):
        return {k: encode(v, f"{prefix}/{k}", tensors) for k, v in value.items()}
    pairs = []
    for k, v in value.items():
        if not isinstance(k, str | int | bool) and k is not None:
            raise SnapshotError(f"cannot snapshot a dict key of type {type(k).__name__} at {prefix!r}")
        pairs.append([k, encode(v, f"{prefix}/{k}", tensors)])
    return {"$dict": pairs}


def decode(tree: Any, tensor_for: Callable[[str], object]) -> Any:
    """Rebuild the value ``encode`` produced; ``tensor_for(name)`` supplies each tensor
    (or what stands in for it: a reference, for a skeleton of the tree)."""
    if isinstance(tree, list):
        return [decode(v, tensor_for) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        (tag, payload), = tree.items()
        if tag == "$tensor":
            return tensor_for(_expect(payload, str, tag))
        if tag == "$tuple":
            return tuple(decode(v, tensor_for) for v in _expect(payload, list, tag))
        if tag == "$dict":
            return {_key(pair): decode(pair[1], tensor_for) for pair in _expect(payload, list, tag)}
        if tag == "$float":
            return float(_expect(payload, str, tag))
        if tag == "$dtype":
            return _dtype(_expect(payload, str, tag))
    return {k: decode(v, tensor_for) for k, v in tree.items()}


def tensor_names(tree: Any) -> list[str]:
    """Every tensor name a tree refers to, in order."""
    names: list[str] = []
    decode(tree, lambda name: names.append(name))
    return names


def _expect(payload: Any, kind: type, tag: str) -> Any:
    if not isinstance(payload, kind):
        raise SnapshotError(f"malformed snapshot state: {tag} holds a {type(payload).__name__}")
    return payload


def _key(pair: Any) -> Any:
    if not (isinstance(pair, list) and len(pair) == 2) or not isinstance(
        pair[0], str | int | bool | type(None)
    ):
        raise SnapshotError("malformed snapshot state: a $dict entry is not a [key, value] pair")
    return pair[0]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SnapshotError(f"malformed snapshot state: unknown dtype {name!r}")
    return dtype

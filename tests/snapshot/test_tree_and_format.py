"""The no-pickle encoding of state and the manifest's validation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import tree
from burst.snapshot.tensors import DTYPES, layout_blobs


def roundtrip(value):
    tensors: dict[str, torch.Tensor] = {}
    encoded = json.loads(json.dumps(tree.encode(value, "s", tensors), allow_nan=False))
    return tree.decode(encoded, tensors.__getitem__)


def test_tuples_int_keys_and_non_finite_floats_survive_json():
    value = {"betas": (0.9, 0.999), "state": {0: {"step": 3}}, "inf": math.inf,
             "dtype": torch.bfloat16, "nested": [None, True, "x"]}
    back = roundtrip(value)
    assert back["betas"] == (0.9, 0.999) and isinstance(back["betas"], tuple)
    assert back["state"] == {0: {"step": 3}} and back["inf"] == math.inf
    assert back["dtype"] is torch.bfloat16 and back["nested"] == [None, True, "x"]


def test_tensors_are_referenced_not_inlined():
    tensors: dict[str, torch.Tensor] = {}
    encoded = tree.encode({"w": torch.ones(3)}, "model", tensors)
    assert encoded == {"w": {"$tensor": "model/w"}} and list(tensors) == ["model/w"]


def test_unsupported_objects_are_refused_with_their_location():
    with pytest.raises(SnapshotError, match="'s/fn'"):
        tree.encode({"fn": object()}, "s", {})


def test_a_dict_key_that_looks_like_a_tag_round_trips():
    assert roundtrip({"$tensor": "not a tensor"}) == {"$tensor": "not a tensor"}


def manifest(**changes) -> bytes:
    base = {"format": 1, "run_id": "r", "step": 1, "state": {},
            "blobs": {"a" * 64: {"size": 16}},
            "tensors": {"t": {"blob": "a" * 64, "dtype": "float32", "shape": [2, 2],
                              "offset": 0, "nbytes": 16}}}
    base.update(changes)
    return json.dumps(base).encode()


def test_a_valid_manifest_parses():
    assert fmt.parse_manifest(manifest())["step"] == 1


@pytest.mark.parametrize("changes, message", [
    ({"format": 5}, "format 5"),
    ({"blobs": {"../x": {"size": 1}}}, "not a hex digest"),
    ({"tensors": {"t": {"blob": "a" * 64, "dtype": "object", "shape": [1], "offset": 0,
                        "nbytes": 8}}}, "unknown dtype"),
    ({"tensors": {"t": {"blob": "a" * 64, "dtype": "float32", "shape": [1000], "offset": 0,
                        "nbytes": 16}}}, "declares 16 bytes"),
    ({"tensors": {"t": {"blob": "a" * 64, "dtype": "float32", "shape": [4], "offset": 8,
                        "nbytes": 16}}}, "outside its blob"),
    ({"tensors": {"t": {"blob": "b" * 64, "dtype": "float32", "shape": [4], "offset": 0,
                        "nbytes": 16}}}, "no valid blob range"),
    ({"run_id": 5}, "'run_id'"),
])
def test_inconsistent_manifests_are_rejected_before_any_read(changes, message):
    with pytest.raises(SnapshotError, match=message):
        fmt.parse_manifest(manifest(**changes))


def test_non_json_manifest_is_rejected():
    with pytest.raises(SnapshotError, match="not valid JSON"):
        fmt.parse_manifest(b"\x80\x04pickle")


def test_small_tensors_are_packed_and_large_ones_stand_alone():
    tensors = {"a": torch.zeros(10), "b": torch.zeros(fmt.PACK_THRESHOLD // 4),
               "c": torch.zeros(3, dtype=torch.float64)}
    blobs = layout_blobs(tensors)
    assert [b.names for b in blobs] == [["b"], ["a", "c"]]
    assert all(o % fmt.ALIGN == 0 for b in blobs for o in b.offsets)


def test_the_formats_dtype_sizes_are_torchs():
    """Manifests are checked without torch, against the format's own table of sizes."""
    assert DTYPES, "this torch has none of the format's dtypes"
    for name, dtype in DTYPES.items():
        assert fmt.ITEMSIZES[name] == torch.empty((), dtype=dtype).element_size(), name

"""The torch-build translation: table-driven over card families, torch releases and drivers."""

from __future__ import annotations

import pytest

from burst.env import torchvariant
from burst.env.torchvariant import Target
from burst.errors import ConfigError


@pytest.mark.parametrize(("card", "family", "capability"), [
    ("NVIDIA H100 80GB HBM3", "Hopper", (9, 0)),
    ("NVIDIA H200", "Hopper", (9, 0)),
    ("NVIDIA H20", "Hopper", (9, 0)),
    ("NVIDIA H800", "Hopper", (9, 0)),
    ("NVIDIA B200", "Blackwell", (10, 0)),
    ("NVIDIA GB200", "Blackwell", (10, 0)),
    ("NVIDIA B300 SXM6 AC", "Blackwell Ultra", (10, 3)),
    ("NVIDIA GeForce RTX 5090", "Blackwell (workstation)", (12, 0)),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell (workstation)", (12, 0)),
    ("NVIDIA A100-SXM4-80GB", "Ampere", (8, 0)),
    ("NVIDIA A800 80GB PCIe", "Ampere", (8, 0)),
    ("NVIDIA A10G", "Ampere (GA10x)", (8, 6)),
    ("NVIDIA A10", "Ampere (GA10x)", (8, 6)),
    ("NVIDIA GeForce RTX 3090", "Ampere (GA10x)", (8, 6)),
    ("NVIDIA RTX A6000", "Ampere (GA10x)", (8, 6)),
    ("NVIDIA L4", "Ada", (8, 9)),
    ("NVIDIA L40S", "Ada", (8, 9)),
    ("NVIDIA GeForce RTX 4090", "Ada", (8, 9)),
    ("NVIDIA RTX 6000 Ada Generation", "Ada", (8, 9)),
    ("Tesla T4", "Turing", (7, 5)),
    ("Tesla V100-SXM2-16GB", "Volta", (7, 0)),
    ("Tesla P100-PCIE-16GB", "Pascal", (6, 0)),
])
def test_card_names_map_to_their_family(card, family, capability):
    found = torchvariant.family_of(card)
    assert found is not None and (found.name, found.capability) == (family, capability)


def test_unknown_card_has_no_family():
    assert torchvariant.family_of("Some Future Accelerator X1") is None


# (torch in the lockfile, recorded build, card capability, driver CUDA) -> the build installed
CASES = [
    ("2.8.0+cpu", "cpu", (9, 0), (12, 8), "cu128"),  # laptop -> H100: never the CPU build
    ("2.8.0+cpu", "cpu", (10, 0), (12, 8), "cu128"),  # -> B200
    ("2.8.0+cpu", "cpu", (9, 0), (12, 6), "cu126"),  # an older driver caps the build
    ("2.8.0+cu126", "cu126", (7, 0), (12, 4), "cu126"),  # the recorded build fits: kept
    ("2.8.0+cu128", "cu128", (6, 0), (12, 8), "cu126"),  # Pascal left cu128 in 2.8
    ("2.11.0+cu128", "cu128", (7, 0), (12, 8), "cu126"),  # Volta left cu128 in 2.11
    ("2.7.1+cu118", "cu118", (9, 0), (12, 8), "cu128"),  # Hopper gets CUDA 12
    ("2.7.1+cu126", "cu126", (12, 0), (12, 8), "cu128"),  # RTX 5090 needs 12.8
    ("2.5.1+cu121", "cu121", (8, 0), (12, 2), "cu121"),  # A100: kept
    ("2.4.0+cpu", "cpu", (7, 5), (12, 2), "cu121"),  # T4, driver 12.2: newest within it
    ("2.9.0+cu130", "cu130", (8, 0), (12, 4), "cu126"),  # a CUDA 12 driver cannot run cu130
    ("2.9.0+cu128", "cu128", (10, 3), (13, 0), "cu130"),  # B300 needs 12.9+
    ("2.8.0", "cu128", (9, 0), (12, 8), "cu128"),  # a PyPI CUDA build that fits
    ("2.8.0+cpu", "cpu", (9, 0), None, "cu129"),  # driver unknown: newest CUDA 12 build
    ("2.7.1+cu118", "cu118", (9, 0), (12, 4), "cu126"),  # none within 12.4: the closest
    ("2.99.0+cpu", "cpu", (9, 0), (13, 0), "cu130"),  # newer than the table: newest row
]


@pytest.mark.parametrize(("torch_version", "recorded", "capability", "driver", "expected"),
                         CASES)
def test_torch_build_is_translated_to_the_card(torch_version, recorded, capability, driver,
                                               expected):
    target = Target("cuda", "card", capability, driver)
    assert torchvariant.choose(torch_version, recorded, target).variant == expected


@pytest.mark.parametrize(("torch_version", "capability", "driver"), [
    ("2.6.0+cu124", (10, 0), (12, 8)),  # no Blackwell build before 2.7
    ("2.9.0+cu128", (10, 3), (12, 8)),  # B300 needs 12.9, this driver stops at 12
    ("2.8.0+cu128", (9, 0), (11, 8)),  # a CUDA 11 driver: no build for torch 2.8
])
def test_no_build_for_the_card_is_a_clear_error(torch_version, capability, driver):
    with pytest.raises(ConfigError, match="no CUDA build for"):
        torchvariant.choose(torch_version, "cu128", Target("cuda", "card", capability, driver))


def test_cpu_and_no_gpu_and_forced_targets():
    assert torchvariant.choose("2.8.0+cu128", "cu128", Target("cpu")).variant == "cpu"
    assert torchvariant.choose("2.8.0+cu128", "cu128", Target("none")).variant == "cu128"
    assert torchvariant.choose("2.8.0+cpu", "cpu", Target("cuda", cuda=(12, 9))).variant == "cu129"
    assert torchvariant.choose("2.8.0+cpu", "cpu", Target("rocm")).variant == "rocm6.4"
    with pytest.raises(ConfigError, match="has no cu124 build"):
        torchvariant.choose("2.8.0+cpu", "cpu", Target("cuda", cuda=(12, 4)))


def test_unknown_capability_without_a_hint_is_an_error():
    with pytest.raises(ConfigError, match="--compute-capability"):
        torchvariant.choose("2.8.0+cpu", "cpu", Target("cuda", "Mystery GPU"))


@pytest.mark.parametrize(("version", "variant", "expected"), [
    ("2.8.0+cpu", "cu128", "2.8.0+cu128"),
    ("0.23.0", "cu126", "0.23.0+cu126"),
    ("2.8.0+cu128", "default", "2.8.0"),
])
def test_retag_keeps_the_release_and_changes_the_build(version, variant, expected):
    assert torchvariant.retag(version, variant) == expected


def test_index_url_fills_the_template():
    assert torchvariant.index_url("cu128", "https://download.pytorch.org/whl/{variant}") == (
        "https://download.pytorch.org/whl/cu128")
    assert torchvariant.index_url("default", "https://x/{variant}") is None

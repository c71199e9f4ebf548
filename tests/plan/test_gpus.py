"""The card catalog: embedded table, device-name lookup, SkyPilot refinement, user cards."""

from __future__ import annotations

import sys
import time
import types
from typing import NamedTuple

import pytest

from burst import config
from burst.errors import ConfigError
from burst.plan import cards as gpus


class Offer(NamedTuple):  # the fields of sky.catalog.common.InstanceTypeInfo burst reads
    cloud: str
    instance_type: str
    accelerator_name: str
    accelerator_count: float
    cpu_count: float
    device_memory: float | None
    memory: float
    price: float
    spot_price: float
    region: str


NAN = float("nan")


def test_builtin_catalog_covers_the_cards_the_issue_names():
    names = set(gpus.builtin().names())
    assert {"T4", "V100", "V100-32GB", "A10G", "L4", "L40S", "RTX3090", "RTX4090", "A100",
            "A100-80GB", "H100", "H200", "B200"} <= names


def test_every_builtin_card_cites_a_source_and_a_date_and_has_the_planning_facts():
    for card in gpus.builtin():
        assert card.source and card.date, card.name
        assert card.memory_gib > 0 and card.tflops_16 and card.tflops_fp32, card.name
        assert card.tf32 == (card.compute_capability >= (8, 0)), card.name


@pytest.mark.parametrize("name, expected", [
    ("a100-80gb", "A100-80GB"), ("A100 80GB", "A100-80GB"), ("rtx 4090", "RTX4090"),
    ("Tesla T4", "T4"), ("h100", "H100"), ("A100-40GB", "A100"),
])
def test_lookup_ignores_case_spaces_and_dashes_and_knows_aliases(name, expected):
    assert gpus.builtin().get(name).name == expected


def test_unknown_card_is_a_one_line_error_listing_close_names():
    with pytest.raises(ConfigError) as error:
        gpus.builtin().get("H1000")
    message = str(error.value)
    assert "\n" not in message and "H1000" in message
    assert "did you mean" in message and "H100" in message


@pytest.mark.parametrize("device, card", [
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-PCIE-40GB", "A100"),
    ("Tesla T4", "T4"), ("Tesla V100-SXM2-32GB", "V100-32GB"), ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"), ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("NVIDIA GeForce RTX 3090", "RTX3090"),
])
def test_cuda_device_names_map_to_catalog_cards(device, card):
    assert gpus.builtin().for_device(device).name == card


def test_cpu_and_unknown_devices_map_to_no_card():
    assert gpus.builtin().for_device("cpu") is None
    assert gpus.builtin().for_device("NVIDIA Quadro P1000") is None


def test_skypilot_offerings_refine_memory_and_cheapest_price_per_gpu():
    offerings = {"A100-80GB": [
        Offer("gcp", "a2-ultragpu-8g", "A100-80GB", 8, 96, 80.0, 1360, 40.0, 12.0, "us-central1"),
        Offer("aws", "p4de.24xlarge", "A100-80GB", 8, 96, 80.0, 1152, 44.0, NAN, "us-east-1"),
        Offer("gcp", "a2-ultragpu-1g", "A100-80GB", 1, 12, 80.0, 170, 5.5, 2.0, "us-east4"),
    ]}
    card = gpus.refine(gpus.builtin(), offerings, "2030-01-02").get("A100-80GB")
    assert card.on_demand == pytest.approx(5.0)  # 40 / 8 beats 5.5 / 1
    assert card.spot == pytest.approx(1.5)  # 12 / 8; NaN ignored
    assert card.memory_gib == 80.0 and card.date == "2030-01-02" and "SkyPilot" in card.source


def test_skypilot_offerings_without_prices_or_memory_keep_the_embedded_figures():
    embedded = gpus.builtin().get("L4")
    offerings = {"L4": [Offer("x", "i", "L4", 1, 4, None, 16, NAN, NAN, "r")]}
    card = gpus.refine(gpus.builtin(), offerings, "2030-01-02").get("L4")
    assert (card.on_demand, card.spot, card.memory_gib) == (
        embedded.on_demand, embedded.spot, embedded.memory_gib)


def test_skypilot_accelerators_the_table_does_not_know_are_not_added():
    offerings = {"K80": [Offer("aws", "p2.xlarge", "K80", 1, 4, 12, 61, 0.9, 0.3, "us-east-1")]}
    assert gpus.refine(gpus.builtin(), offerings, "2030-01-02").find("K80") is None


def test_skypilot_catalog_absent_means_the_embedded_table_alone(monkeypatch):
    monkeypatch.setitem(sys.modules, "sky", None)  # import sky fails, as when not installed
    assert gpus.skypilot_offerings(timeout=5) is None
    assert gpus.load({}, skypilot=True).get("H100") == gpus.builtin().get("H100")


def test_slow_skypilot_catalog_is_abandoned_after_the_timeout(monkeypatch):
    fake_catalog = types.ModuleType("sky.catalog")
    fake_catalog.list_accelerators = lambda **_: time.sleep(5) or {}  # type: ignore[attr-defined]
    fake_sky = types.ModuleType("sky")
    fake_sky.catalog = fake_catalog  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sky", fake_sky)
    monkeypatch.setitem(sys.modules, "sky.catalog", fake_catalog)
    started = time.monotonic()
    assert gpus.skypilot_offerings(timeout=0.2) is None
    assert time.monotonic() - started < 2


def test_config_adds_a_card_with_its_aliases():
    catalog = gpus.from_config({"A6000": {"memory_gib": 48, "compute_capability": "8.6",
                                          "bf16": True, "tflops_16": 154.8,
                                          "aliases": ["NVIDIA RTX A6000"]}}, gpus.builtin())
    card = catalog.for_device("NVIDIA RTX A6000")
    assert card is not None and card.name == "A6000" and card.bf16 and card.tf32


def test_config_for_a_known_card_overrides_only_the_fields_it_sets():
    card = gpus.from_config({"h100": {"on_demand": 2.49, "source": "my provider"}},
                            gpus.builtin()).get("H100")
    assert card.on_demand == 2.49 and card.source == "my provider"
    assert card.memory_gib == 80 and card.bf16


@pytest.mark.parametrize("table, complaint", [
    ({"memory_gb": 48}, "unknown field 'memory_gb'"),
    ({"compute_capability": "8.6"}, "needs memory_gib"),
    ({"memory_gib": -1}, "positive number"),
    ({"memory_gib": 24, "compute_capability": "ampere"}, "compute_capability"),
    ({"memory_gib": 24, "bf16": "yes"}, "true or false"),
])
def test_bad_config_cards_are_one_line_errors(table, complaint):
    with pytest.raises(ConfigError, match=complaint) as error:
        gpus.from_config({"MyCard": table}, gpus.builtin())
    assert "\n" not in str(error.value)


def test_load_takes_gpus_tables_from_the_config_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[gpus.MI300X]\nmemory_gib = 192\ncompute_capability = "9.4"\n'
                    "bf16 = true\ntflops_16 = 1307\n")
    catalog = gpus.load(config.load(path))
    assert catalog.get("mi300x").memory_gib == 192


def test_a_named_config_file_that_is_missing_or_broken_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[gpus\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(tmp_path / "bad.toml")

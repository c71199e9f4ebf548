"""``burst plan`` for Beijing: own capacity first, tiers shown, only places that exist."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.plan import cards as gpus
from burst.plan import offerings
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest
from tests.plan import skypilot_catalog

MIRROR = "docker:registry.cn-beijing.aliyuncs.com/lab/skypilot-gpu:0.14"
CONFIG = f"""
[regions.beijing]
kubernetes = ["bj-a100"]
ssh = ["bj-lab"]
image_id = "{MIRROR}"
"""


@pytest.fixture
def setup(monkeypatch, tmp_path):
    """A run that ran out of memory on an L4, SkyPilot's catalog cached, a Beijing config."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("burst plan asked SkyPilot's catalog in a test")
    monkeypatch.setattr(gpus, "skypilot_offerings", refuse)
    monkeypatch.setenv("SKY_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(offerings.CATALOG_ENV, raising=False)
    skypilot_catalog.write(tmp_path)
    url = str(tmp_path / "store")
    put_manifest(open_store(url), manifest("run", peaks={8: 3 * GIB, 16: 5 * GIB},
                                           global_batch=64, micro=8, card="NVIDIA L4",
                                           reason="oom"))
    config = tmp_path / "burst.toml"
    config.write_text(CONFIG)
    return ["run", "--store", url, "--offline", "--region", "beijing", "--config", str(config)]


def plan(*args: str):
    return CliRunner().invoke(main, ["plan", *args])


def test_plan_json_puts_the_k8s_context_and_ssh_pool_first_with_their_tier(setup):
    result = plan(*setup, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    fits = [c for c in data["candidates"] if c["fits"]]
    assert [(c["infra"], c["tier"]) for c in fits[:2]] == [("k8s/bj-a100", "own"),
                                                           ("ssh/bj-lab", "own")]
    assert data["chosen"]["image_id"] == MIRROR and data["order"] == ["own", "spot", "on-demand"]
    assert all(c["image_id"] is None for c in fits if c["tier"] != "own")


def test_plan_json_holds_no_place_the_catalog_lacks_and_lists_what_it_skipped(setup):
    data = json.loads(plan(*setup, "--json").output)
    places = offerings.load()
    for c in data["candidates"]:
        if c["fits"]:
            assert places.check(c["infra"], c["card"], c["spot"]).exists is not False, c
    assert {"infra": "gcp/asia-east2", "card": "A100-80GB", "spot": False, "tier": "on-demand",
            "why": "gcp offers no A100-80GB in asia-east2 (SkyPilot's cached catalog "
                   "(aws, gcp))"} in data["skipped"]


def test_plan_table_shows_the_tier_column_and_the_mirror_image(setup):
    result = plan(*setup, "--gpu", "A100,A100-80GB")
    assert result.exit_code == 0, result.output
    assert "tier" in result.output and "own > spot > on-demand" in result.output
    assert "image_id docker:registry.cn-beijing" in result.output
    assert "crossings skipped" in result.output


def test_order_flag_puts_public_spot_before_own_capacity(setup):
    data = json.loads(plan(*setup, "--json", "--order", "spot,own,on-demand").output)
    tiers = [c["tier"] for c in data["candidates"] if c["fits"]]
    assert tiers[0] == "spot" and tiers.index("own") < tiers.index("on-demand")


def test_a_bad_order_flag_is_one_line_and_non_zero(setup):
    result = plan(*setup, "--order", "own,cheapest")
    assert result.exit_code != 0 and "'cheapest' is not a tier" in result.output
    assert "Traceback" not in result.output and result.output.strip().count("\n") == 0

"""Only places that exist: SkyPilot's cached catalog (in its own CSV layout), else the table."""

from __future__ import annotations

import pytest

from burst.plan import cards as gpus
from burst.plan import offered, offerings, regions
from burst.plan.planner import rank
from tests.helpers.plan_helpers import facts
from tests.helpers.sky_helpers import run_in_skypilot
from tests.plan import skypilot_catalog

CATALOG = gpus.builtin()
RUN = facts(static_gib=4, slope_gib=0.5, global_batch=64)
REGIONS = {"aws": ("us-east-1", "ap-northeast-1", "ap-east-1", "eu-west-1"),
           "gcp": ("asia-northeast1", "asia-southeast1", "asia-east2", "us-central1")}


@pytest.fixture
def cached(tmp_path):
    """SkyPilot's catalog cached where SkyPilot keeps it, found through $SKY_RUNTIME_DIR."""
    skypilot_catalog.write(tmp_path)
    return offerings.load({"SKY_RUNTIME_DIR": str(tmp_path)})


_READING = """
import io, math
import pandas
from sky.catalog import common
RESULT = []
for cloud, text in PAYLOAD:
    listed = common.list_accelerators_impl(cloud.upper(), pandas.read_csv(io.StringIO(text)),
                                           gpus_only=True, name_filter=None,
                                           region_filter=None, quantity_filter=None,
                                           all_regions=True)
    for name, infos in listed.items():
        for info in infos:
            RESULT.append([cloud, info.region, name, not math.isnan(info.spot_price)])
"""


def skypilots_reading() -> dict[tuple[str, str, str], bool]:
    """(cloud, region, accelerator) -> spot offered, as SkyPilot's own catalog code reads
    the fixture (``sky.catalog.common.list_accelerators_impl``, the code behind
    ``sky show-gpus``), run in SkyPilot's own environment."""
    found: dict[tuple[str, str, str], bool] = {}
    rows = run_in_skypilot(_READING, [["aws", skypilot_catalog.AWS],
                                      ["gcp", skypilot_catalog.GCP]])
    for cloud, region, name, spot in rows:
        found[(cloud, region, name)] = found.get((cloud, region, name), False) or spot
    return found


def test_every_cloud_region_card_verdict_matches_skypilots_own_reading(cached):
    truth = skypilots_reading()
    for cloud, places in REGIONS.items():
        for region in places:
            for card in CATALOG:
                for spot in (False, True):
                    offered_there = (cloud, region, card.name) in truth
                    want = offered_there and (truth.get((cloud, region, card.name)) or not spot)
                    verdict = cached.check(f"{cloud}/{region}", card.name, spot)
                    assert verdict.exists is want, (cloud, region, card.name, spot, verdict)


def test_the_cached_catalog_gives_per_region_prices_per_gpu(cached):
    tokyo = cached.check("aws/ap-northeast-1", "A100", False)
    virginia = cached.check("aws/us-east-1", "A100", True)
    assert tokyo.price == pytest.approx(30.09784 / 8)
    assert virginia.price == pytest.approx(8.8 / 8)  # the cheaper of its two zones


def test_without_a_cached_catalog_the_embedded_table_decides(tmp_path):
    table = offerings.load({"SKY_RUNTIME_DIR": str(tmp_path)})
    assert table.sources == [offered.SOURCE]
    assert table.check("gcp/asia-southeast1", "A100-80GB", False).exists is True
    for region in ("asia-east2", "asia-northeast1", "asia-northeast3"):
        assert table.check(f"gcp/{region}", "A100-80GB", False).exists is False
    assert table.check("aws/eu-west-1", "RTX4090", True).exists is False
    assert table.check("azure/eastus", "L4", False).exists is None  # not in the table


def test_the_offline_table_knows_aws_a100_80gb_and_azures_regions(tmp_path):
    table = offerings.load({"SKY_RUNTIME_DIR": str(tmp_path)})
    found = table.check("aws/us-east-1", "A100-80GB", False)
    assert found.exists is True and found.price == 3.431  # p4de.24xlarge / 8
    assert table.check("aws/ap-northeast-2", "A100-80GB", True).exists is False
    assert table.check("azure/eastus", "A100-80GB", True).exists is True
    # SkyPilot's own Azure catalog lists the US regions only: it cannot launch in Asia
    for region in ("eastasia", "japaneast", "koreacentral", "southeastasia"):
        verdict = table.check(f"azure/{region}", "A100-80GB", False)
        assert verdict.exists is False and "no A100-80GB in" in verdict.reason


def test_the_catalog_answers_for_its_clouds_and_the_table_for_the_others(cached):
    assert cached.check("azure/eastasia", "RTX3090", False).exists is False  # table: absent
    assert cached.check("gcp/asia-east2", "A100-80GB", False).exists is False  # catalog
    assert cached.check("k8s/bj", "RTX4090", False) == offerings.UNCHECKED
    assert cached.check(None, "RTX4090", True) == offerings.UNCHECKED


def test_an_opt_in_region_says_so(tmp_path):
    table = offerings.load({"SKY_RUNTIME_DIR": str(tmp_path)})
    verdict = table.check("aws/ap-east-1", "T4", False)
    assert verdict.exists is True and "opt-in" in verdict.note


def test_infeasible_places_never_take_a_candidate_slot(cached):
    profile = regions.profile("beijing", {"beijing": {"kubernetes": ["bj"], "ssh": ["lab"]}})
    ranking = rank(RUN, list(CATALOG), profile, offerings=cached)
    public = [p for p in ranking.plans if p.fits and not p.target.place.own_capacity]
    assert public and ranking.skipped
    for plan in public:
        assert cached.check(plan.target.place.infra, plan.target.card.name,
                            plan.target.spot).exists is not False
    skipped = {(t.place.infra, t.card.name, t.spot) for t, _ in ranking.skipped}
    assert ("gcp/asia-east2", "A100-80GB", False) in skipped
    assert ("aws/ap-northeast-1", "A100", True) in skipped  # no spot price there
    assert all("offers no" in why or "no spot" in why for _, why in ranking.skipped)


def test_a_region_price_replaces_the_cards_list_price(cached):
    profile = regions.Profile("p", (regions.place("aws/ap-northeast-1"),))
    plans = rank(RUN, [CATALOG.get("A100")], profile, offerings=cached).plans
    assert plans[0].price_per_hour == pytest.approx(30.09784 / 8)

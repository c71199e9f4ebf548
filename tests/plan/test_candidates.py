"""Choosing where: candidate order (spot, price, places), Kubernetes spot, OOM, profiles."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.plan import cards as gpus
from burst.plan import regions
from burst.plan.planner import Options, PlanError, candidates, choose
from tests.helpers.plan_helpers import facts

CATALOG = gpus.builtin()
CARDS = [CATALOG.get(n) for n in ("L4", "A100", "A100-80GB", "H100")]
PUBLIC = regions.Profile("two", (regions.place("aws/us-east-1"), regions.place("gcp/us-central1")))
RUN = facts(static_gib=4, slope_gib=0.5, global_batch=64)


def keys(plans):
    return [(p.target.card.name, p.target.place.label, p.target.spot) for p in plans if p.fits]


def test_every_spot_entry_comes_before_every_on_demand_entry():
    spots = [p.target.spot for p in candidates(RUN, CARDS, PUBLIC) if p.fits]
    assert spots == sorted(spots, reverse=True) and spots[0] and not spots[-1]


def test_within_a_tier_the_cheapest_fitting_card_comes_first():
    plans = [p for p in candidates(RUN, CARDS, PUBLIC) if p.fits and p.target.spot]
    prices = [p.target.card.spot or p.target.card.on_demand for p in plans]  # no spot figure: on-demand
    assert prices == sorted(prices) and plans[0].target.card.name == "L4"


def test_for_one_card_the_places_follow_the_profile_order():
    plans = keys(candidates(RUN, [CATALOG.get("A100")], PUBLIC))
    assert plans == [("A100", "aws/us-east-1", True), ("A100", "gcp/us-central1", True),
                     ("A100", "aws/us-east-1", False), ("A100", "gcp/us-central1", False)]


def test_kubernetes_contexts_get_no_spot_entries_and_the_plan_says_why():
    profile = regions.Profile("p", (regions.place("k8s/lab"), regions.place("aws/us-east-1")))
    plans = [p for p in candidates(RUN, [CATALOG.get("A100")], profile) if p.fits]
    assert [(p.target.place.label, p.target.spot) for p in plans] == [
        ("k8s/lab", False), ("aws/us-east-1", True), ("aws/us-east-1", False)]
    assert any("GKE or Karpenter" in note for note in plans[0].notes)


def test_a_context_listed_with_recognised_spot_labels_gets_spot_entries():
    profile = regions.profile("mine", {"mine": {"kubernetes_spot": ["karp"]}})
    plans = [p for p in candidates(RUN, [CATALOG.get("A100")], profile) if p.fits]
    assert [(p.target.place.label, p.target.spot) for p in plans] == [
        ("k8s/karp", True), ("k8s/karp", False)]


def test_ssh_pools_are_on_demand_only_and_carry_no_catalog_price():
    profile = regions.Profile("p", (regions.place("ssh/bj-lab"),))
    plans = [p for p in candidates(RUN, [CATALOG.get("A100")], profile) if p.fits]
    assert [p.target.spot for p in plans] == [False]
    assert plans[0].price_per_hour is None


def test_after_an_oom_only_cards_bigger_than_the_failed_one_are_candidates():
    run = facts(static_gib=4, slope_gib=0.5, reason="oom", card="NVIDIA A100-SXM4-40GB")
    plans = candidates(run, CARDS, PUBLIC, old_card=CATALOG.get("A100"))
    assert {p.target.card.name for p in plans if p.fits} == {"A100-80GB", "H100"}
    refused = [p for p in plans if p.target.card.name == "L4"]
    assert refused and "ran out of memory on A100" in refused[0].problem


def test_targets_without_a_plan_come_last_with_their_problem():
    run = facts(static_gib=30, slope_gib=0.5)
    plans = candidates(run, CARDS, PUBLIC)
    fits = [p.fits for p in plans]
    assert fits == sorted(fits, reverse=True)
    assert [p.target.card.name for p in plans if not p.fits] == ["L4"]
    assert "fits nowhere on L4" in plans[-1].problem


def test_more_gpus_are_candidates_of_their_own_priced_per_gpu_count():
    plans = candidates(RUN, [CATALOG.get("A100")], PUBLIC, counts=(1, 2))
    on_demand = [p for p in plans if p.fits and not p.target.spot]
    assert [p.target.count for p in on_demand] == [1, 1, 2, 2]
    assert on_demand[2].price_per_hour == pytest.approx(2 * CATALOG.get("A100").on_demand)


@pytest.mark.parametrize("policy, tiers", [("never", {False}), ("only", {True})])
def test_spot_policy_can_leave_out_a_tier(policy, tiers):
    plans = candidates(RUN, CARDS, PUBLIC, options=Options(spot=policy))
    assert {p.target.spot for p in plans if p.fits} == tiers


def test_beijing_profile_lists_the_users_clusters_first_then_nearby_public_regions():
    profile = regions.profile("beijing", {"beijing": {"kubernetes": ["bj-k8s"],
                                                      "ssh": ["bj-lab"]}})
    labels = [p.label for p in profile.places]
    assert labels[:2] == ["k8s/bj-k8s", "ssh/bj-lab"]
    assert labels[2:] and all(not label.startswith(("k8s/", "ssh/")) for label in labels[2:])
    assert {"aws/ap-east-1", "aws/ap-northeast-1", "aws/ap-northeast-2",
            "aws/ap-southeast-1"} <= set(labels)
    assert any("no SkyPilot cloud reaches mainland China" in n for n in profile.notes)


def test_beijing_profile_without_clusters_says_how_to_add_them():
    profile = regions.profile("beijing")
    assert any("[regions.beijing]" in note for note in profile.notes)


def test_unknown_profile_is_a_one_line_error_listing_the_known_ones():
    with pytest.raises(ConfigError) as error:
        regions.profile("bejing")
    assert "\n" not in str(error.value) and "did you mean beijing" in str(error.value)


def test_bad_profile_config_is_an_error():
    with pytest.raises(ConfigError, match="list of names"):
        regions.profile("beijing", {"beijing": {"kubernetes": "bj"}})


def test_choose_takes_the_first_fitting_plan():
    plans = candidates(RUN, CARDS, PUBLIC)
    assert choose(plans) is plans[0] and plans[0].fits


def test_choose_explains_in_one_line_when_nothing_fits():
    plans = candidates(facts(static_gib=4, slope_gib=200), CARDS, PUBLIC)
    with pytest.raises(PlanError) as error:
        choose(plans)
    message = str(error.value)
    assert "\n" not in message and "fits nowhere on" in message and "of 80 GiB" in message
    assert "activation checkpointing" in message


def test_an_offline_beijing_plan_lists_only_places_that_exist(tmp_path):
    from burst.plan import offerings

    table = offerings.load({"SKY_RUNTIME_DIR": str(tmp_path)})  # no catalog: the table
    profile = regions.profile("beijing")
    plans = [p for p in candidates(RUN, [CATALOG.get("A100-80GB")], profile, offerings=table)
             if p.fits]
    places = {p.target.place.label for p in plans}
    assert places and not any(label.startswith("azure/") for label in places)  # US only
    assert "aws/ap-northeast-1" in places and "gcp/asia-southeast1" in places
    assert "aws/ap-northeast-2" not in places  # no p4de in Seoul

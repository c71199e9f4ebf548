"""Your own capacity first: failover tiers, their configured order, and the mirror image."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.plan import cards as gpus
from burst.plan import regions
from burst.plan.planner import Options, candidates
from tests.helpers.plan_helpers import facts
from tests.helpers.sky_helpers import sky_view

CATALOG = gpus.builtin()
RUN = facts(static_gib=4, slope_gib=0.5, global_batch=64)
MIRROR = "docker:registry.cn-beijing.aliyuncs.com/lab/skypilot-gpu:0.14"
BEIJING = {"beijing": {"kubernetes_spot": ["bj-karp"], "kubernetes": ["bj-a100"],
                       "ssh": ["bj-lab"], "image_id": MIRROR}}


def tiers(plans):
    return [p.target.tier for p in plans if p.fits]


def fitting(order=None, table=BEIJING):
    profile = regions.profile("beijing", table)
    return [p for p in candidates(RUN, [CATALOG.get("A100")], profile,
                                  options=Options(order=order)) if p.fits]


def test_beijing_tries_its_kubernetes_contexts_and_ssh_pools_before_any_public_region():
    plans = fitting()
    own = [(p.target.place.infra, p.target.spot) for p in plans[:4]]
    assert own == [("k8s/bj-karp", True), ("k8s/bj-karp", False), ("k8s/bj-a100", False),
                   ("ssh/bj-lab", False)]
    assert tiers(plans) == sorted(tiers(plans), key=regions.TIERS.index)
    assert {"own", "spot", "on-demand"} == set(tiers(plans))


def test_an_order_from_the_command_line_moves_own_capacity_after_public_spot():
    got = tiers(fitting(order="spot,own,on-demand"))
    assert got == sorted(got, key=("spot", "own", "on-demand").index) and got[0] == "spot"


def test_a_profile_order_leaving_out_spot_uses_no_public_spot():
    table = {"beijing": {**BEIJING["beijing"], "order": ["on-demand", "own"]}}
    plans = fitting(table=table)
    assert not any(p.target.spot for p in plans if not p.target.place.own_capacity)
    assert tiers(plans)[0] == "on-demand" and tiers(plans)[-1] == "own"


@pytest.mark.parametrize("order", ["own,cheap", "spot,spot", ""])
def test_a_bad_order_is_a_one_line_error(order):
    with pytest.raises(ConfigError) as error:
        regions.parse_order(order, "--order")
    assert "\n" not in str(error.value) and "own, spot, on-demand" in str(error.value)


def test_the_mirror_image_goes_to_own_capacity_only_and_the_plan_says_so():
    plans = fitting()
    profile = regions.profile("beijing", BEIJING)
    for plan in plans:
        own = plan.target.place.own_capacity
        assert plan.target.place.image_id == (MIRROR if own else None)
        assert (f"image_id {MIRROR}" in plan.notes) is own
    assert any(MIRROR in note for note in profile.notes)


def test_beijing_clusters_without_a_mirror_image_get_a_warning():
    profile = regions.profile("beijing", {"beijing": {"kubernetes": ["bj"]}})
    assert any("docker.pkg.dev" in note and "image_id" in note for note in profile.notes)


def test_a_rendered_task_carries_the_image_and_skypilot_parses_it():
    from burst.launch.task import NodeSoftware, TaskSpec, render

    plans = fitting()[:6]
    spec = TaskSpec("run-1", 7, "oom", "burst-run-1", plans, ["python", "train.py"],
                    {"BURST_RUN_ID": "run-1"}, (), NodeSoftware(None, "burst-failover"))
    task = sky_view(render(spec).yaml)
    images = [r["image_id"] for r in task["resources"]]
    assert len(images) == len(plans)
    for plan, image in zip(plans, images, strict=True):
        if plan.target.place.own_capacity:
            assert image and MIRROR.removeprefix("docker:") in str(image)
        else:
            assert image is None

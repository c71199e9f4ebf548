"""What a burst into mainland China needs before burst's bootstrap runs: an image its nodes
can pull, and a managed-jobs controller placed where it reaches PyPI and that image."""

from __future__ import annotations

from burst.plan import regions
from burst.preflight import mainland
from burst.preflight.table import FAIL, OK, WARN

ACR = "docker:registry.cn-beijing.aliyuncs.com/me/skypilot:latest"


def beijing(**table: object) -> regions.Profile:
    return regions.profile("beijing", {"beijing": {"kubernetes": ["bj-a100"], **table}})


def test_own_capacity_without_an_image_fails_naming_the_registry_it_cannot_pull():
    image, _ = mainland.rows(beijing(), {})
    assert image.status == FAIL and "us-central1-docker.pkg.dev" in image.detail
    assert "image_id" in image.fix and "k8s/bj-a100" in image.detail


def test_an_image_on_a_google_registry_is_the_same_problem():
    image = mainland.image_row(beijing(image_id="docker:us-docker.pkg.dev/x/y:1"), ["k8s/x"])
    assert image.status == FAIL


def test_a_mirrored_image_passes_and_says_what_else_it_must_carry():
    image, _ = mainland.rows(beijing(image_id=ACR), {})
    assert image.status == OK and ACR in image.detail and "PyPI" in image.detail


def test_an_unplaced_controller_warns_that_it_may_land_on_the_kubernetes_context():
    _, controller = mainland.rows(beijing(image_id=ACR), {})
    assert controller.status == WARN and "jobs: controller: resources" in controller.fix


def test_a_controller_on_the_context_needs_an_image_of_its_own():
    k8s = {"jobs": {"controller": {"resources": {"infra": "k8s/bj-a100"}}}}
    assert mainland.controller_row(k8s).status == WARN
    k8s["jobs"]["controller"]["resources"]["image_id"] = ACR
    assert mainland.controller_row(k8s).status == OK
    cloud = {"jobs": {"controller": {"resources": {"infra": "aws/ap-east-1"}}}}
    assert mainland.controller_row(cloud).status == OK


def test_the_controller_is_read_from_skypilots_config_file(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("jobs:\n  controller:\n    resources:\n      infra: gcp/asia-east2\n")
    monkeypatch.setenv(mainland.SKY_CONFIG_ENV, str(config))
    _, controller = mainland.rows(beijing(image_id=ACR))
    assert controller.status == OK and "gcp/asia-east2" in controller.detail


def test_a_profile_without_own_capacity_has_no_mainland_rows():
    assert mainland.rows(regions.profile("us"), {}) == []

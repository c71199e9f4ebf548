"""Does a burst into mainland China have what SkyPilot needs before burst's bootstrap runs?

burst's node needs only the store; SkyPilot's own start of that node needs more, and in
mainland China it is what breaks first (read in SkyPilot 0.14.1's source):

- the image: Kubernetes contexts and SSH pools start SkyPilot's default image,
  ``skypilot:custom-gpu-ubuntu-2204`` from ``us-central1-docker.pkg.dev``
  (``sky/clouds/kubernetes.py``), which mainland China cannot pull; ``image_id`` in
  ``[regions.beijing]`` must name a mirror (and one on ``*-docker.pkg.dev`` or ``gcr.io``
  is the same problem);
- the managed-jobs controller: with no ``jobs.controller.resources`` in SkyPilot's config
  (``~/.sky/config.yaml``, ``$SKYPILOT_GLOBAL_CONFIG``) SkyPilot's optimizer puts it on any
  enabled cloud or context, the Kubernetes one included, where its pod needs the image and
  PyPI too (it installs SkyPilot there); pin it to a place that reaches both;
- SkyPilot's runtime on the node is installed from its installer site and PyPI before
  ``setup`` runs: the mirrored image must carry it (or a pip mirror its pip is set to).

The first two are checked here; the third is said in the image row, since only the image
can answer it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from burst.plan.regions import Profile
from burst.preflight.table import FAIL, OK, WARN, Row

IMAGE, CONTROLLER = "mainland image", "jobs controller"
UNREACHABLE_REGISTRIES = ("-docker.pkg.dev", "gcr.io")  # Google's registries
SKY_CONFIG_ENV = "SKYPILOT_GLOBAL_CONFIG"
RUNTIME_NOTE = ("the image must also carry SkyPilot's runtime or a pip mirror: SkyPilot "
                "installs it from its installer site and PyPI before burst's setup runs")


def rows(profile: Profile, sky_config: dict[str, Any] | None = None) -> list[Row]:
    """The image row and the controller row for ``profile`` (empty when it holds no own
    capacity: nothing of this applies to a public cloud outside China)."""
    own = [p for p in profile.places if p.own_capacity]
    if not own:
        return []
    config = load_sky_config() if sky_config is None else sky_config
    return [image_row(profile, [p.infra or "" for p in own]), controller_row(config)]


def image_row(profile: Profile, places: Sequence[str]) -> Row:
    image = profile.image_id
    where = ", ".join(places)
    fix = (f"set image_id = \"docker:<mirror registry>/<image>\" under [regions."
           f"{profile.name}] (an image on a registry the nodes reach, e.g. Alibaba ACR)")
    if image is None:
        return Row(IMAGE, FAIL, f"{where} would start SkyPilot's default image from "
                   "us-central1-docker.pkg.dev, which mainland China cannot pull", fix)
    if any(host in image for host in UNREACHABLE_REGISTRIES):
        return Row(IMAGE, FAIL, f"image_id {image} is on a Google registry, which mainland "
                   "China cannot pull", fix)
    return Row(IMAGE, OK, f"{where} start from {image}; {RUNTIME_NOTE}")


def controller_row(config: dict[str, Any]) -> Row:
    resources = ((config.get("jobs") or {}).get("controller") or {}).get("resources") or {}
    fix = ("pin it in ~/.sky/config.yaml: jobs: controller: resources: infra: <a cloud "
           "region or context that reaches PyPI and your registry> (and image_id there for "
           "a Kubernetes one)")
    placed = resources.get("infra") or resources.get("cloud")
    if not placed:
        return Row(CONTROLLER, WARN, "SkyPilot's config does not place the managed-jobs "
                   "controller: it may land on the Kubernetes context, where its pod needs "
                   "the image and PyPI as well", fix)
    if str(placed).lower().startswith(("k8s", "kubernetes", "ssh")) and not resources.get(
            "image_id"):
        return Row(CONTROLLER, WARN, f"the managed-jobs controller runs on {placed} with "
                   "SkyPilot's default image (from us-central1-docker.pkg.dev)", fix)
    return Row(CONTROLLER, OK, f"the managed-jobs controller runs on {placed}")


def sky_config_path() -> Path:
    return Path(os.environ.get(SKY_CONFIG_ENV) or Path.home() / ".sky" / "config.yaml")


def load_sky_config() -> dict[str, Any]:
    """SkyPilot's user config (none: empty), read as a file: asking SkyPilot costs seconds."""
    import yaml

    try:
        data = yaml.safe_load(sky_config_path().read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}

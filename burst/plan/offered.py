"""Where each card is offered, when SkyPilot's catalog is not on this machine: sourced and dated.

The planner must never put a (cloud, region, card) in a candidate slot where the cloud has
no such machine: SkyPilot would fail over past it at launch time, after burst has already
spent one of its ordered entries. With SkyPilot's own catalog cached on this machine
(:mod:`burst.plan.offerings` reads it) that catalog decides; without it, this table does.

What the table says, and how far it can be trusted:

- ``REGIONS``: for each (cloud, card) it lists, *every* region where the cloud offered the
  card on the date given; a region of that cloud not listed is a place that does not
  exist. (cloud, card) pairs the table does not list are unknown: not refused, marked
  unverified.
- ``ABSENT``: cards a cloud offers in no region at all.
- ``PRICES``: on-demand $/h per GPU in one region, where a source gave one (ranking only).
- ``OPT_IN``: regions an account must enable before anything launches there.

Sources (read 2026-12-01):

- ``gcp``: SkyPilot's hosted catalog, ``skypilot-org/skypilot-catalog`` file
  ``catalogs/v8/gcp/vms.csv`` at commit 006059e0f18a (machine families a2-highgpu: A100,
  a2-ultragpu: A100-80GB, a3-highgpu and a3-edgegpu: H100).
- ``aws``: instances.vantage.sh region lists as published in ``tsaol/aws-gpu``
  ``data/g4dn_instances.js``, ``data/p4d_instances.js``, ``data/p5_instances.js`` (updated
  2026-08-26) and ``data/g5_instances.js`` (updated 2025-11-30); prices are the on-demand
  list prices there, per instance divided by its GPU count. Opt-in regions: AWS "Specify
  which AWS Regions your account can use" (ap-east-1 Hong Kong is opt-in since its launch).
- ``ABSENT``: the instance families each cloud documents (no RTX 3090/4090 on any of the
  three; A10G is an AWS-only part; GCP has no L40S or A10; AWS has no A10).

Update this table from the same sources when a cloud adds a region; SkyPilot's catalog,
when cached, supersedes it anyway.
"""

from __future__ import annotations

SOURCE = "burst's embedded table of 2026-12-01 (burst/plan/offered.py)"
DATE = "2026-12-01"

_GCP_A100 = ("asia-northeast1", "asia-northeast3", "asia-southeast1", "europe-west4", "me-west1",
             "us-central1", "us-east1", "us-west1", "us-west3", "us-west4")
_GCP_A100_80 = ("asia-southeast1", "europe-west4", "us-central1", "us-east4", "us-east5")
_GCP_H100 = ("asia-east1", "asia-northeast1", "asia-northeast3", "asia-south1", "asia-south2",
             "asia-southeast1", "australia-southeast1", "europe-north1", "europe-west1",
             "europe-west2", "europe-west3", "europe-west4", "europe-west8", "europe-west9",
             "northamerica-northeast2", "us-central1", "us-east4", "us-east5", "us-west1",
             "us-west4")
_AWS_T4 = ("af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
           "ap-south-1", "ap-southeast-1", "ap-southeast-2", "ca-central-1", "eu-central-1",
           "eu-north-1", "eu-south-1", "eu-west-1", "eu-west-2", "eu-west-3", "me-south-1",
           "sa-east-1", "us-east-1", "us-east-2", "us-gov-east-1", "us-gov-west-1", "us-west-1",
           "us-west-2")
_AWS_A10G = ("ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-2",
             "ap-southeast-3", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1",
             "eu-west-2", "il-central-1", "me-central-1", "sa-east-1", "us-east-1", "us-east-2",
             "us-west-2")
_AWS_A100 = ("ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-1",
             "ap-southeast-2", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1",
             "eu-west-2", "sa-east-1", "us-east-1", "us-east-2", "us-gov-west-1", "us-west-2")
_AWS_H100 = ("ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-2",
             "ap-southeast-3", "ca-central-1", "eu-north-1", "eu-west-2", "sa-east-1",
             "us-east-1", "us-east-2", "us-gov-west-1", "us-west-1", "us-west-2")

# (cloud, card) -> every region offering it on DATE
REGIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("gcp", "A100"): _GCP_A100,
    ("gcp", "A100-80GB"): _GCP_A100_80,
    ("gcp", "H100"): _GCP_H100,
    ("aws", "T4"): _AWS_T4,
    ("aws", "A10G"): _AWS_A10G,
    ("aws", "A100"): _AWS_A100,
    ("aws", "H100"): _AWS_H100,
}

# cloud -> cards it offers nowhere
ABSENT: dict[str, tuple[str, ...]] = {
    "aws": ("A10", "RTX3090", "RTX4090"),
    "gcp": ("A10G", "A10", "L40S", "RTX3090", "RTX4090"),
    "azure": ("A10G", "RTX3090", "RTX4090"),
}

# (cloud, region, card) -> on-demand $/h per GPU (p4d.24xlarge / 8; p5.4xlarge, else p5.48xlarge / 8)
PRICES: dict[tuple[str, str, str], float] = {
    ("aws", "ap-northeast-1", "A100"): 3.762, ("aws", "ap-northeast-2", "A100"): 3.801,
    ("aws", "ap-southeast-1", "A100"): 3.294, ("aws", "eu-central-1", "A100"): 3.429,
    ("aws", "eu-west-1", "A100"): 2.964, ("aws", "us-east-1", "A100"): 2.745,
    ("aws", "us-west-2", "A100"): 2.745,
    ("aws", "ap-northeast-1", "H100"): 8.6, ("aws", "ap-northeast-2", "H100"): 9.494,
    ("aws", "us-east-1", "H100"): 6.88, ("aws", "us-west-2", "H100"): 6.88,
}

# (cloud, region) -> what the user must do first
OPT_IN: dict[tuple[str, str], str] = {
    ("aws", "ap-east-1"): "AWS ap-east-1 (Hong Kong) is an opt-in region: enable it for the "
                          "account (and run `sky check aws`) or SkyPilot cannot launch there",
}

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
- ``aws`` A100-80GB (read 2026-12-02): ``tsaol/aws-gpu`` ``data/p4de_instances.js``
  (instances.vantage.sh data, updated 2025-12-21): p4de.24xlarge, 8x A100 80GB; the price
  per GPU is the instance's on-demand list price divided by 8.
- ``azure`` (read 2026-12-02): SkyPilot's hosted catalog, ``skypilot-org/skypilot-catalog``
  file ``catalogs/v6/azure/vms.csv`` at commit 098741e70562 (NC A100 v4 and ND A100 v4 80GB:
  A100-80GB; ND A100 v4: A100; NC H100 v5 and ND H100 v5: H100; NCas T4 v3: T4; NCv3: V100;
  NVads A10 v5: A10). That catalog is built by SkyPilot's fetcher with its default region
  filter, ``US_REGIONS`` in ``sky/catalog/data_fetchers/fetch_azure.py`` (0.14.1), so it
  lists Azure's US regions only: an Azure region elsewhere (eastasia, japaneast...) is not
  a place SkyPilot launches to with its own catalog, and the table says so.
- ``ABSENT``: the instance families each cloud documents (no RTX 3090/4090 on any of the
  three; A10G is an AWS-only part; GCP has no L40S or A10; AWS has no A10).

Update this table from the same sources when a cloud adds a region; SkyPilot's catalog,
when cached, supersedes it anyway.
"""

from __future__ import annotations

SOURCE = "burst's embedded table of 2026-12-02 (burst/plan/offered.py)"
DATE = "2026-12-02"

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
_AWS_A100_80 = ("ap-northeast-1", "ap-southeast-1", "eu-central-1", "il-central-1", "us-east-1",
                "us-west-2")
_AZURE_A100_80 = ("centralus", "eastus", "eastus2", "southcentralus", "westus", "westus2",
                  "westus3")
_AZURE_A100 = ("eastus", "southcentralus", "westus2")
_AZURE_H100 = ("eastus", "eastus2", "southcentralus", "westus", "westus3")
_AZURE_T4 = ("centralus", "eastus", "eastus2", "northcentralus", "southcentralus", "westus",
             "westus2", "westus3")
_AZURE_V100 = ("centralus", "eastus", "eastus2", "southcentralus", "westus", "westus2",
               "westus3")
_AZURE_A10 = ("eastus", "eastus2", "northcentralus", "southcentralus", "westus", "westus2",
              "westus3")

# (cloud, card) -> every region offering it on DATE
REGIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("gcp", "A100"): _GCP_A100,
    ("gcp", "A100-80GB"): _GCP_A100_80,
    ("gcp", "H100"): _GCP_H100,
    ("aws", "T4"): _AWS_T4,
    ("aws", "A10G"): _AWS_A10G,
    ("aws", "A100"): _AWS_A100,
    ("aws", "H100"): _AWS_H100,
    ("aws", "A100-80GB"): _AWS_A100_80,
    ("azure", "A100-80GB"): _AZURE_A100_80,
    ("azure", "A100"): _AZURE_A100,
    ("azure", "H100"): _AZURE_H100,
    ("azure", "T4"): _AZURE_T4,
    ("azure", "V100"): _AZURE_V100,
    ("azure", "A10"): _AZURE_A10,
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
    # p4de.24xlarge / 8
    ("aws", "ap-northeast-1", "A100-80GB"): 4.703, ("aws", "ap-southeast-1", "A100-80GB"): 4.117,
    ("aws", "eu-central-1", "A100-80GB"): 4.286, ("aws", "il-central-1", "A100-80GB"): 4.447,
    ("aws", "us-east-1", "A100-80GB"): 3.431, ("aws", "us-west-2", "A100-80GB"): 3.431,
    # Standard_NC24ads_A100_v4 (1 GPU), Standard_ND96asr_v4 / 8, Standard_NC40ads_H100_v5 (1 GPU)
    ("azure", "eastus", "A100-80GB"): 3.673, ("azure", "westus3", "A100-80GB"): 3.673,
    ("azure", "eastus", "A100"): 3.4, ("azure", "eastus", "H100"): 6.98,
}

# (cloud, region) -> what the user must do first
OPT_IN: dict[tuple[str, str], str] = {
    ("aws", "ap-east-1"): "AWS ap-east-1 (Hong Kong) is an opt-in region: enable it for the "
                          "account (and run `sky check aws`) or SkyPilot cannot launch there",
}

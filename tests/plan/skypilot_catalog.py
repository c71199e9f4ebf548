"""A small SkyPilot catalog in SkyPilot's own v8 CSV layout, for the placement tests.

Headers are those of ``catalogs/v8/aws/vms.csv`` and ``catalogs/v8/gcp/vms.csv`` in SkyPilot's
hosted catalog: AWS lists instance types with their GPUs; GCP lists host VMs (no
accelerator) and attachable accelerators (no instance type) as separate rows. Written
where SkyPilot caches it (``$SKY_RUNTIME_DIR/.sky/catalogs/v8/<cloud>/vms.csv``).
"""

from __future__ import annotations

from pathlib import Path

AWS = """\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch
c5.large,,,2.0,4.0,,0.085,0.035,us-east-1,use1-az1,x86_64
g4dn.xlarge,T4,1.0,4.0,16.0,"{'Gpus': [{'Name': 'T4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 16384}}], 'TotalGpuMemoryInMiB': 16384}",0.71,0.25,ap-east-1,ape1-az1,x86_64
g4dn.xlarge,T4,1.0,4.0,16.0,"{'Gpus': [{'Name': 'T4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 16384}}], 'TotalGpuMemoryInMiB': 16384}",0.526,0.21,us-east-1,use1-az1,x86_64
g5.xlarge,A10G,1.0,4.0,16.0,"{'Gpus': [{'Name': 'A10G', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 24576}}], 'TotalGpuMemoryInMiB': 24576}",1.459,0.5,ap-northeast-1,apne1-az1,x86_64
p4d.24xlarge,A100,8.0,96.0,1152.0,"{'Gpus': [{'Name': 'A100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 40960}}], 'TotalGpuMemoryInMiB': 327680}",30.09784,,ap-northeast-1,apne1-az1,x86_64
p4d.24xlarge,A100,8.0,96.0,1152.0,"{'Gpus': [{'Name': 'A100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 40960}}], 'TotalGpuMemoryInMiB': 327680}",21.957642,8.8,us-east-1,use1-az1,x86_64
p4d.24xlarge,A100,8.0,96.0,1152.0,"{'Gpus': [{'Name': 'A100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 40960}}], 'TotalGpuMemoryInMiB': 327680}",21.957642,9.6,us-east-1,use1-az2,x86_64
p5.48xlarge,H100,8.0,192.0,2048.0,"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}",55.04,20.0,us-east-1,use1-az1,x86_64
"""

GCP = """\
InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice
a2-highgpu-1g,12.0,85.0,,,,asia-northeast1,asia-northeast1-a,0.94803,0.41783
a2-ultragpu-1g,12.0,170.0,,,,asia-southeast1,asia-southeast1-c,1.35641,0.62379
n1-standard-8,8.0,30.0,,,,asia-east2,asia-east2-a,0.4,0.1
,,,A100,1.0,A100,asia-northeast1,asia-northeast1-a,3.22,1.2
,,,A100-80GB,1.0,A100-80GB,asia-southeast1,asia-southeast1-c,4.52,1.81
,,,T4,1.0,T4,asia-east2,asia-east2-a,0.4,0.16
,,,L4,1.0,L4,asia-northeast1,asia-northeast1-a,0.7,
"""


def write(root: Path) -> Path:
    """The catalog under ``root`` as ``$SKY_RUNTIME_DIR``; returns the versioned directory."""
    directory = root / ".sky" / "catalogs" / "v8"
    for cloud, text in (("aws", AWS), ("gcp", GCP)):
        (directory / cloud).mkdir(parents=True, exist_ok=True)
        (directory / cloud / "vms.csv").write_text(text)
    return directory

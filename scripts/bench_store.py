"""Benchmark: push and pull against an S3 server over TLS on loopback, beside like-for-like boto3.

    .venv/bin/python scripts/bench_store.py [--gib 0.25] [--repeat 5] [--server rclone]

Prints, for the same bytes in the same run (runs interleaved, medians reported, since a
shared machine is noisy):

- burst push and pull of one snapshot (several 64 MiB blobs);
- boto3 ``upload_file`` / ``download_file`` of the same bytes as one file, with the same
  checksum settings as burst (``when_required`` for a non-AWS endpoint), plain and with the
  SHA-256 that burst computes on every blob (hashed before the upload, or after the download
  by reading the file back): the like-for-like baselines the targets are measured against;
- a local ``cp`` (the ceiling);
- the bytes the second push of a real fine-tune sends: a small network whose backbone is
  frozen (``requires_grad=False``) and whose head alone is trained by Adam, snapshotted
  through ``burst.Run`` before and after a few optimizer steps. The fraction comes from
  what training changed, not from a layout chosen for the benchmark.

Each case also shows the CPU seconds spent on burst's side (this process) and by the
server, and the push ratio those allow at best: on a machine whose cores the server
shares, a push cannot finish faster than the server's own CPU time for the bytes.

The server is SeaweedFS (``weed mini``: an S3 gateway in front of a filer and a volume
server, about 17 s of CPU per GiB written) or, with ``--server rclone``, ``rclone serve
s3`` over plain files (about 8 s per GiB). Both run on the client's cores, so the push
figure says more about the server than about burst; the cheaper server shows more of
the difference burst makes.

Not a timed test: numbers depend on the machine (here transfers are CPU-bound, and the
server runs on the same cores). burst's pull also fsyncs what it wrote; boto3 does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import burst  # noqa: E402
from burst.node.bootstrap import sha256_of  # noqa: E402
from burst.snapshot import sync  # noqa: E402
from burst.snapshot import tiers as snapshot  # noqa: E402
from burst.snapshot.tiers import Captured  # noqa: E402
from burst.store import LocalStore, open_store  # noqa: E402
from tests.helpers.store_servers import (  # noqa: E402
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    self_signed_cert,
    start_rclone,
    start_seaweed,
    stop,
)

SERVERS = {"seaweed": start_seaweed, "rclone": start_rclone}
TENSOR = 64 << 20  # bytes per tensor (one blob each)
Case = tuple[Callable[[], object], Callable[[], None]]  # (timed, reset before it)


def model_state(total: int) -> dict[str, torch.Tensor]:
    """``total`` bytes of random float32 tensors, one blob each."""
    g = torch.Generator().manual_seed(0)
    return {f"t.{i}": torch.randn(TENSOR // 4, generator=g) for i in range(total // TENSOR)}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Measured:
    """Per case: wall seconds, and CPU seconds of this process and of the server."""

    wall: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)


def interleaved(cases: dict[str, Case], repeat: int, server_pid: int) -> dict[str, Measured]:
    """Each case ``repeat`` times, round-robin (so a noisy spell hits every case alike)."""
    measured = {name: Measured() for name in cases}
    for _ in range(repeat):
        for name, (fn, reset) in cases.items():
            reset()
            client, server = time.process_time(), process_cpu(server_pid)
            started = time.perf_counter()
            fn()
            measured[name].wall.append(time.perf_counter() - started)
            measured[name].client_cpu.append(time.process_time() - client)
            measured[name].server_cpu.append(process_cpu(server_pid) - server)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=0.25)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--server", choices=sorted(SERVERS), default="seaweed",
                        help="the S3 server on loopback (see the module's docstring)")
    args = parser.parse_args()
    total = max(TENSOR, int(args.gib * (1 << 30)))
    work = Path(tempfile.mkdtemp(prefix="burst-bench-"))
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "BURST_CONFIG": os.devnull})
    cert, key = self_signed_cert(work)
    server = SERVERS[args.server](work / args.server, cert, key)
    os.environ["AWS_CA_BUNDLE"] = str(cert)
    try:
        run(server, args.server, work, total, args.repeat)
    finally:
        assert server.process is not None
        stop(server.process)
        shutil.rmtree(work, ignore_errors=True)


def run(server, name: str, work: Path, total: int, repeat: int) -> None:
    import boto3
    import botocore.config

    local = LocalStore(work / "local")
    state = model_state(total)
    manifest = snapshot.write_snapshot(local, "bench", Captured(1, {}, state, {"reason": "b"}))
    size = sum(info["size"] for info in manifest["blobs"].values())
    flat = work / "snapshot.bin"  # the same bytes as one file, for boto3 and cp
    with open(flat, "wb") as f:
        for tensor in state.values():
            f.write(memoryview(tensor.numpy()).cast("B"))
    del state
    options = {"endpoint_url": server.endpoint, "addressing_style": "path"}
    remote = {"store": open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", **options)}
    sync.push(local, remote["store"], "bench")  # what the pulls read

    def fresh_remote() -> None:
        remote["push"] = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", **options)

    # boto3's defaults, but the checksum settings burst uses for a non-AWS endpoint
    client = boto3.client("s3", endpoint_url=server.endpoint, config=botocore.config.Config(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required"))
    key = f"boto/{uuid.uuid4().hex}"
    client.upload_file(str(flat), BUCKET, key)
    pulled, down, copy = work / "pulled", work / "down.bin", work / "copy.bin"

    def hashed_upload() -> None:
        sha256_of(str(flat))
        client.upload_file(str(flat), BUCKET, f"boto/{uuid.uuid4().hex}")

    def hashed_download() -> None:
        client.download_file(BUCKET, key, str(down))
        sha256_of(str(down))

    def nothing() -> None:
        pass

    cases: dict[str, Case] = {
        "burst push": (lambda: sync.push(local, remote["push"], "bench"), fresh_remote),
        "boto3 sha256 + upload_file": (hashed_upload, nothing),
        "boto3 upload_file": (lambda: client.upload_file(str(flat), BUCKET,
                                                         f"boto/{uuid.uuid4().hex}"), nothing),
        "burst pull": (lambda: sync.pull(remote["store"], LocalStore(pulled), "bench"),
                       lambda: shutil.rmtree(pulled, ignore_errors=True)),
        "boto3 download_file + sha256": (hashed_download, lambda: down.unlink(missing_ok=True)),
        "boto3 download_file": (lambda: client.download_file(BUCKET, key, str(down)),
                                lambda: down.unlink(missing_ok=True)),
        "cp": (lambda: subprocess.run(["cp", str(flat), str(copy)], check=True),
               lambda: copy.unlink(missing_ok=True)),
    }
    assert server.process is not None
    report(interleaved(cases, repeat, server.process.pid), size, repeat, name)
    fine_tune(work, server.endpoint)


def report(measured: dict[str, Measured], size: int, repeat: int, server: str) -> None:
    mib = size / (1 << 20)
    med = {name: statistics.median(m.wall) for name, m in measured.items()}
    print(f"\n{mib:.0f} MiB snapshot, {server} over TLS on 127.0.0.1, median of {repeat} "
          "interleaved runs (min-max), and CPU seconds of burst's side and of the server:")
    for name, m in measured.items():
        print(f"  {name:30s} {med[name]:7.2f} s  {mib / med[name]:6.0f} MiB/s  "
              f"({min(m.wall):.2f}-{max(m.wall):.2f})  cpu: client "
              f"{statistics.median(m.client_cpu):5.2f} s, server "
              f"{statistics.median(m.server_cpu):5.2f} s")

    def ratio(baseline: str, ours: str) -> float:
        return med[baseline] / med[ours]

    print(f"  burst push vs boto3 sha256 + upload_file:   "
          f"{ratio('boto3 sha256 + upload_file', 'burst push'):.2f}x  (target >= 1.3x)")
    print(f"  burst push vs boto3 upload_file:            "
          f"{ratio('boto3 upload_file', 'burst push'):.2f}x")
    print(f"  burst pull vs boto3 download_file + sha256: "
          f"{ratio('boto3 download_file + sha256', 'burst pull'):.2f}x  (target >= 1.1x)")
    print(f"  burst pull vs boto3 download_file:          "
          f"{ratio('boto3 download_file', 'burst pull'):.2f}x  (no hashing, no fsync)")
    print(f"  burst push, pull vs cp: {ratio('cp', 'burst push'):.2f}x, "
          f"{ratio('cp', 'burst pull'):.2f}x of the local ceiling")
    push_bound(measured)


def push_bound(measured: dict[str, Measured]) -> None:
    """What the push ratio could reach here at best: client and server share these cores,
    so if burst's side of a push cost no CPU at all, a push would still take the server's
    CPU seconds, against the baseline's client and server CPU seconds together."""
    def cpu(name: str, side: str) -> float:
        return statistics.median(getattr(measured[name], side))

    baseline = "boto3 sha256 + upload_file"
    best = ((cpu(baseline, "client_cpu") + cpu(baseline, "server_cpu"))
            / cpu("burst push", "server_cpu"))
    print(f"  push, the server's share of the CPU: {cpu('burst push', 'server_cpu'):.2f} s "
          f"of {cpu('burst push', 'server_cpu') + cpu('burst push', 'client_cpu'):.2f} s; "
          f"a push whose client cost nothing would reach {best:.2f}x the hashed baseline "
          f"on cores shared with the server")


def fine_tune(work: Path, endpoint: str, width: int = 1024, frozen_layers: int = 12,
              steps: int = 4) -> None:
    """Two snapshots of a real fine-tune, ``steps`` optimizer steps apart; the second push
    sends what training changed (the head, its Adam moments, the small packed tensors)."""
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(*[m for _ in range(frozen_layers)
                                     for m in (torch.nn.Linear(width, width), torch.nn.GELU())])
    head = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                               torch.nn.Linear(width, 10))
    model = torch.nn.Sequential(backbone, head)
    backbone.requires_grad_(False)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(16 * steps, width),
                                          torch.randint(0, 10, (16 * steps,)))
    run = burst.Run("finetune", store=work / "ft-local", global_batch=16, micro_batch=8,
                    persist_seconds=None, keep=2)
    sampler = burst.ResumableSampler(data, seed=0)
    run.attach(model, optimizer, sampler=sampler)
    loader = torch.utils.data.DataLoader(data, batch_size=run.micro_batch, sampler=sampler)
    remote = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", endpoint_url=endpoint,
                        addressing_style="path")
    local = LocalStore(work / "ft-local")
    pushes = []
    for _epoch in run.epochs(2):  # a snapshot after each epoch of ``steps`` steps
        for step in run.steps(loader):
            for x, y in step:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (loss * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
        run.snapshot(wait=True)
        pushes.append(sync.push(local, remote, "finetune")[0])
    run.close()
    first, second = pushes
    trainable = sum(p.numel() * p.element_size() for p in head.parameters())
    print(f"  fine-tune, frozen backbone ({frozen_layers}x{width}x{width}), Adam on the head, "
          f"{steps} steps between snapshots:")
    print(f"    first push {first.bytes_sent / (1 << 20):.1f} MiB; second push sent "
          f"{second.bytes_sent / (1 << 20):.1f} MiB of {second.total_bytes / (1 << 20):.1f} "
          f"MiB = {second.bytes_sent / second.total_bytes:.1%} (head + 2 Adam moments = "
          f"{3 * trainable / second.total_bytes:.1%} of the bytes)")


if __name__ == "__main__":
    main()

"""Benchmark: a 1 GiB snapshot against SeaweedFS over TLS on loopback, side by side.

    .venv/bin/python scripts/bench_store.py [--gib 1] [--repeat 2]

Prints, for the same bytes in the same run: burst push and pull, boto3's ``upload_file`` /
``download_file`` with their defaults, and a local ``cp`` (the ceiling), as seconds, MiB/s
and ratios; then the bytes a frozen-backbone second snapshot uploads against the first.
Not a timed test: numbers depend on the machine (here uploads are CPU-bound).

The snapshot models a fine-tune with a frozen backbone: 13/16 of the bytes are backbone
weights that never change; the trainable head and its two Adam moments change every step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from burst.snapshot import sync  # noqa: E402
from burst.snapshot import tiers as snapshot  # noqa: E402
from burst.snapshot.tiers import Captured  # noqa: E402
from burst.store import LocalStore, open_store  # noqa: E402
from tests.store_servers import (  # noqa: E402
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    self_signed_cert,
    start_seaweed,
    stop,
)

TENSOR = 64 << 20  # bytes per tensor


def model_state(total: int, step: int) -> dict[str, torch.Tensor]:
    """``total`` bytes: 13/16 frozen backbone, 1/16 head, 2/16 Adam moments of the head."""
    n = total // TENSOR
    frozen = n * 13 // 16
    g = torch.Generator().manual_seed(0)
    state = {f"backbone.{i}": torch.randn(TENSOR // 4, generator=g) for i in range(frozen)}
    h = torch.Generator().manual_seed(step)
    for i in range(n - frozen):
        state[f"trainable.{i}"] = torch.randn(TENSOR // 4, generator=h)
    return state


def timed(fn: Callable[[], object], repeat: int, reset: Callable[[], None]) -> float:
    """Best wall time of ``repeat`` runs, ``reset`` before each (not timed)."""
    best = float("inf")
    for _ in range(repeat):
        reset()
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    total = int(args.gib * (1 << 30))
    work = Path(tempfile.mkdtemp(prefix="burst-bench-"))
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "BURST_CONFIG": os.devnull})
    cert, key = self_signed_cert(work)
    server = start_seaweed(work / "seaweed", cert, key)
    os.environ["AWS_CA_BUNDLE"] = str(cert)
    try:
        run(server, work, total, args.repeat)
    finally:
        assert server.process is not None
        stop(server.process)
        shutil.rmtree(work, ignore_errors=True)


def run(server, work: Path, total: int, repeat: int) -> None:
    import boto3

    local = LocalStore(work / "local")
    first = model_state(total, step=1)
    manifest = snapshot.write_snapshot(local, "bench", Captured(1, {}, first, {"reason": "b"}))
    size = sum(info["size"] for info in manifest["blobs"].values())
    flat = work / "snapshot.bin"  # the same bytes as one file, for boto3 and cp
    with open(flat, "wb") as f:
        for tensor in first.values():
            f.write(memoryview(tensor.numpy()).cast("B"))
    del first
    options = {"endpoint_url": server.endpoint, "addressing_style": "path"}
    remote = {"store": None}

    def fresh_remote() -> None:
        remote["store"] = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", **options)

    client = boto3.client("s3", endpoint_url=server.endpoint)  # boto3's defaults throughout
    results: dict[str, float] = {}
    results["burst push"] = timed(lambda: sync.push(local, remote["store"], "bench"), repeat,
                                  fresh_remote)
    pulled = work / "pulled"
    results["burst pull"] = timed(lambda: sync.pull(remote["store"], LocalStore(pulled), "bench"),
                                  repeat, lambda: shutil.rmtree(pulled, ignore_errors=True))
    key = f"boto/{uuid.uuid4().hex}"
    results["boto3 upload_file"] = timed(lambda: client.upload_file(str(flat), BUCKET, key),
                                         repeat, lambda: None)
    down = work / "down.bin"
    results["boto3 download_file"] = timed(lambda: client.download_file(BUCKET, key, str(down)),
                                           repeat, lambda: down.unlink(missing_ok=True))
    copy = work / "copy.bin"
    results["cp"] = timed(lambda: subprocess.run(["cp", str(flat), str(copy)], check=True),
                          repeat, lambda: copy.unlink(missing_ok=True))
    report(results, size)
    incremental(local, remote["store"], total, size)


def report(results: dict[str, float], size: int) -> None:
    mib = size / (1 << 20)
    print(f"\n{mib:.0f} MiB snapshot, SeaweedFS over TLS on 127.0.0.1, best of runs:")
    for name, seconds in results.items():
        print(f"  {name:22s} {seconds:7.2f} s  {mib / seconds:8.0f} MiB/s")
    push = results["boto3 upload_file"] / results["burst push"]
    pull = results["boto3 download_file"] / results["burst pull"]
    print(f"  burst push vs boto3 upload_file:   {push:.2f}x  (target >= 1.2x)")
    print(f"  burst pull vs boto3 download_file: {pull:.2f}x  (target >= 1.0x)")
    print(f"  burst push vs cp: {results['cp'] / results['burst push']:.2f}x of the local ceiling")
    print(f"  burst pull vs cp: {results['cp'] / results['burst pull']:.2f}x of the local ceiling")


def incremental(local: LocalStore, remote, total: int, size: int) -> None:
    second = model_state(total, step=2)
    snapshot.write_snapshot(local, "bench", Captured(2, {}, second, {"reason": "b"}))
    transfer = sync.push(local, remote, "bench", step=2)[0]
    ratio = transfer.bytes_sent / size
    print(f"  frozen-backbone second snapshot: {transfer.bytes_sent / (1 << 20):.0f} MiB sent of "
          f"{size / (1 << 20):.0f} MiB = {ratio:.1%}  (target <= 35%)")


if __name__ == "__main__":
    main()

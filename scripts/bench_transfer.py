"""Benchmark: a wheelhouse's way into the store and onto the node, against SeaweedFS over
TLS on loopback, beside the plain ways of moving the same files.

    .venv/bin/python scripts/bench_transfer.py [--wheels 8] [--mib 64] [--repeat 3]

Synthetic wheels (random bytes, ``--wheels`` files of ``--mib`` MiB) are moved both ways,
each case ``--repeat`` times, interleaved (a shared machine is noisy), medians reported:

- up: burst's wheelhouse upload (:func:`burst.env.wheelhouse.upload`: several wheels at
  once, each a parallel multipart upload from disk) against boto3's ``upload_file`` of each
  wheel in turn (its own multipart threads, the same ``when_required`` checksum settings),
  and against what burst did before (one PUT per wheel, the file read whole into memory);
- down: the node bootstrap's :func:`burst.node.bootstrap.download` (four wheels at once,
  each hashed as it lands, resumable) against a plain sequential urllib GET of each wheel,
  signed and hashed the same way (what the bootstrap did before).

Loopback has no latency and the server shares the client's cores, so this measures CPU and
scheduling more than a long link; the gain from several streams is larger where one
stream is held back by its own window (a Beijing node reading a far region). Not a timed
test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from burst.env import wheelhouse  # noqa: E402
from burst.node import bootstrap  # noqa: E402
from burst.store import open_store  # noqa: E402
from tests.helpers.store_servers import (  # noqa: E402
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    self_signed_cert,
    start_seaweed,
    stop,
)

Case = tuple[Callable[[], object], Callable[[], None]]  # (timed, reset before it)
SERVER_PID: list[int] = []  # the server's process, whose CPU seconds each case reports


def make_wheels(root: Path, count: int, size: int) -> list[wheelhouse.Wheel]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        path = root / f"synthetic{i}-1.0-py3-none-any.whl"
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
        sha = bootstrap.sha256_of(str(path))
        out.append(wheelhouse.Wheel(f"synthetic{i}", "1.0", path.name, sha, size, "dependency",
                                    path))
    return out


def interleaved(cases: dict[str, Case], repeat: int) -> dict[str, list[tuple[float, ...]]]:
    """Each case ``repeat`` times, round-robin: (wall, client CPU, server CPU) seconds."""
    times: dict[str, list[tuple[float, ...]]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, (fn, reset) in cases.items():
            reset()
            client, server = time.process_time(), process_cpu(SERVER_PID[0])
            started = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - started, time.process_time() - client,
                                process_cpu(SERVER_PID[0]) - server))
    return times


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="burst-bench-transfer-"))
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "BURST_CONFIG": os.devnull})
    cert, key = self_signed_cert(work)
    server = start_seaweed(work / "seaweed", cert, key)
    os.environ["AWS_CA_BUNDLE"] = str(cert)
    assert server.process is not None
    SERVER_PID.append(server.process.pid)
    try:
        wheels = make_wheels(work / "wheels", args.wheels, args.mib << 20)
        total = args.wheels * (args.mib << 20)
        up = uploads(server.endpoint, wheels, args.repeat)
        down = downloads(server.endpoint, str(cert), wheels, work, args.repeat)
        report({**up, **down}, total, args)
    finally:
        assert server.process is not None
        stop(server.process)
        shutil.rmtree(work, ignore_errors=True)


def uploads(endpoint: str, wheels: list[wheelhouse.Wheel], repeat: int
            ) -> dict[str, list[tuple[float, ...]]]:
    import boto3
    import botocore.config

    options = {"endpoint_url": endpoint, "addressing_style": "path"}
    house = wheelhouse.Wheelhouse(wheelhouse.Target("3.11"), wheels)
    client = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required"))
    fresh: dict[str, object] = {}

    def new_prefix() -> None:
        fresh["store"] = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", **options)
        fresh["prefix"] = uuid.uuid4().hex

    def burst_upload() -> None:
        wheelhouse.upload(fresh["store"], "bench", "ab" * 32, house)  # type: ignore[arg-type]

    def boto3_each() -> None:
        for wheel in wheels:
            client.upload_file(str(wheel.path), BUCKET, f"{fresh['prefix']}/{wheel.key}")

    def whole_puts() -> None:  # what burst did before: one PUT per wheel, read whole
        store = fresh["store"]
        for wheel in wheels:
            assert wheel.path is not None
            store.put_if_absent(wheel.key, wheel.path.read_bytes())  # type: ignore[attr-defined]

    return interleaved({"up: burst wheelhouse upload": (burst_upload, new_prefix),
                        "up: boto3 upload_file per wheel": (boto3_each, new_prefix),
                        "up: one PUT per wheel, read whole": (whole_puts, new_prefix)}, repeat)


def downloads(endpoint: str, ca_bundle: str, wheels: list[wheelhouse.Wheel], work: Path,
              repeat: int) -> dict[str, list[tuple[float, ...]]]:
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    wheelhouse.upload(open_store(url, endpoint_url=endpoint, addressing_style="path"),
                      "bench", "ab" * 32, wheelhouse.Wheelhouse(wheelhouse.Target("3.11"),
                                                               wheels))
    env = {"BURST_ENDPOINT_URL": endpoint, "BURST_CA_BUNDLE": ca_bundle,
           "BURST_ADDRESSING_STYLE": "path", "BURST_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    source = bootstrap.open_source(url, env)
    entries = [w.to_json() for w in wheels]
    dest = work / "node"

    def clean() -> None:
        shutil.rmtree(dest, ignore_errors=True)

    def ours() -> None:
        fetched, _ = bootstrap.download(source, entries, str(dest))
        assert fetched == sum(w.size for w in wheels)

    def sequential() -> None:  # one signed GET after another, hashed as it lands
        dest.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            target = source.url(entry["key"])
            headers = bootstrap.sigv4_headers("GET", target, "us-east-1", ACCESS_KEY,
                                              SECRET_KEY)
            sha = hashlib.sha256()
            request = urllib.request.Request(target, headers=headers)
            with urllib.request.urlopen(request, context=source.context) as response, \
                    open(dest / entry["file"], "wb") as out:
                for block in iter(lambda r=response: r.read(bootstrap.CHUNK), b""):
                    sha.update(block)
                    out.write(block)
            assert sha.hexdigest() == entry["sha256"]

    return interleaved({"down: bootstrap download": (ours, clean),
                        "down: sequential urllib GET": (sequential, clean)}, repeat)


def report(times: dict[str, list[tuple[float, ...]]], total: int, args: argparse.Namespace
           ) -> None:
    mib = total / (1 << 20)
    med = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
    print(f"\n{args.wheels} wheels x {args.mib} MiB = {mib:.0f} MiB, SeaweedFS over TLS on "
          f"127.0.0.1, median of {args.repeat} interleaved runs (min-max), and the CPU "
          f"seconds of this side and of the server:")
    for name, runs in times.items():
        walls = [t[0] for t in runs]
        print(f"  {name:36s} {med[name]:7.2f} s  {mib / med[name]:6.0f} MiB/s  "
              f"({min(walls):.2f}-{max(walls):.2f})  cpu: client "
              f"{statistics.median(t[1] for t in runs):5.2f} s, server "
              f"{statistics.median(t[2] for t in runs):5.2f} s")

    def ratio(baseline: str, ours: str) -> float:
        return med[baseline] / med[ours]

    print(f"  upload vs boto3 upload_file per wheel:  "
          f"{ratio('up: boto3 upload_file per wheel', 'up: burst wheelhouse upload'):.2f}x")
    print(f"  upload vs one PUT per wheel (before):   "
          f"{ratio('up: one PUT per wheel, read whole', 'up: burst wheelhouse upload'):.2f}x")
    print(f"  node download vs sequential urllib GET: "
          f"{ratio('down: sequential urllib GET', 'down: bootstrap download'):.2f}x")


if __name__ == "__main__":
    main()

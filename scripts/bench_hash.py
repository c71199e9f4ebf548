"""Benchmark: the hash that names and verifies snapshot blobs (issue 32), in GiB/s.

    .venv/bin/python scripts/bench_hash.py [--mib 512] [--repeat 3]

Each way hashes the same ``--mib`` MiB buffer, ``--repeat`` times, medians reported:

- SHA-256 (``hashlib``) on one thread, and spread over N threads (the buffer cut into N
  equal pieces hashed at once; hashlib lets go of the GIL), which is what a blob's
  ``CHUNK_BYTES`` chunk hashes can do, though not its one whole-blob name;
- BLAKE3 (the ``blake3`` package) with ``max_threads`` 1 and N: one digest of the whole
  buffer, its tree hashed by N threads;
- :func:`burst.snapshot.format.digest` as burst calls it for a blob this size.

N is this machine's core count. GiB/CPU-s is the bytes per second of CPU time the
process used: what hashing costs the cores, which stays meaningful on a machine other work
shares (the wall figure then is whatever the scheduler left). Not a timed test: the
figures depend on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from burst.snapshot import format as fmt


def sha256_threads(view: memoryview, threads: int) -> None:
    step = -(-len(view) // threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda s: hashlib.sha256(view[s : s + step]).digest(),
                      range(0, len(view), step)))


def timed(fn: Callable[[], object], nbytes: int, repeat: int) -> tuple[float, float]:
    """Median GiB/s over ``repeat`` runs: per second of wall time, and per second of this
    process's CPU time (what the hash costs a core, even when other work shares them)."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(nbytes / (time.perf_counter() - wall) / 2**30)
        cpus.append(nbytes / max(time.process_time() - cpu, 1e-9) / 2**30)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    data = bytearray(os.urandom(1 << 20)) * args.mib
    view, n = memoryview(data), len(data)
    cases: dict[str, Callable[[], object]] = {
        "sha256, 1 thread": lambda: hashlib.sha256(view).digest(),
        f"sha256, {cores} threads (pieces)": lambda: sha256_threads(view, cores),
        "blake3, 1 thread": lambda: blake3.blake3(view, max_threads=1).digest(),
        f"blake3, {cores} threads": lambda: blake3.blake3(view, max_threads=cores).digest(),
        "burst fmt.digest (blake3)": lambda: fmt.digest(view, fmt.BLAKE3),
        "burst chunk hashes (blake3)": lambda: fmt.chunk_digests(view, fmt.BLAKE3),
    }
    print(f"{args.mib} MiB buffer, {cores} cores, median of {args.repeat}")
    print(f"  {'':34s} {'GiB/s':>7} {'GiB/CPU-s':>10}")
    for name, fn in cases.items():
        wall, cpu = timed(fn, n, args.repeat)
        print(f"  {name:34s} {wall:7.2f} {cpu:10.2f}")


if __name__ == "__main__":
    main()

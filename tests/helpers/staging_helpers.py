"""Synthetic wheelhouses for the staging tests and scripts/bench_burst.py: real wheel files
(a zip with metadata and a RECORD, installable by pip) whose payload is random bytes of a
chosen size, so a test can stage "torch" without downloading it."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from burst.env import wheelhouse
from burst.env.lockfile import Lockfile, Package

CHUNK = 8 << 20


def synthetic_wheel(directory: Path, name: str, size: int, version: str = "1.0") -> Path:
    """``name``-``version``-py3-none-any.whl holding ``size`` random bytes (stored)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: burst-test\nRoot-Is-Purelib: "
                              "true\nTag: py3-none-any\n"}
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
            record.append(_record(member, text.encode()))
        digest = hashlib.sha256()
        with wheel.open(f"{dist}/payload.bin", "w", force_zip64=True) as out:
            left = size
            while left > 0:
                chunk = os.urandom(min(left, CHUNK))
                digest.update(chunk)
                out.write(chunk)
                left -= len(chunk)
        hashed = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
        record.append(f"{dist}/payload.bin,sha256={hashed},{size}")
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def _record(member: str, data: bytes) -> str:
    hashed = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{member},sha256={hashed},{len(data)}"


def house_of(paths: list[Path], target: wheelhouse.Target, burst_wheel: Path | None = None
             ) -> wheelhouse.Wheelhouse:
    """A built wheelhouse of these wheel files (roles: burst for ``burst_wheel``)."""
    wheels = []
    for path in paths:
        name, version = path.name.split("-")[:2]
        wheels.append(wheelhouse.Wheel(name, version, path.name, _sha256(path),
                                       path.stat().st_size,
                                       "burst" if path == burst_wheel else "dependency", path))
    return wheelhouse.Wheelhouse(target, wheels)


def small_lock(*names: str) -> Lockfile:
    return Lockfile([Package(n, "1.0") for n in names], python={"version": "3.11.4"})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()

"""Repacking what is installed here into wheels the node installs.

Where pip cannot fetch a pin (no index reachable, or the pin is not on it), the
distribution installed in the environment being frozen is the one the run was using:
it is rebuilt into a wheel from its ``RECORD`` when its ``WHEEL`` tags run on the node (a
macOS or Windows build does not: it is listed missing). Repacked wheels are deterministic
and cached under a fingerprint of that ``RECORD``, so the same install is repacked once;
the index marks them ``"repacked": true``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from packaging import tags as wheeltags

from burst.env import lockfile
from burst.env.wheelhouse.house import Say, WheelhouseError, same_version
from burst.env.wheelhouse.pins import Pin
from burst.env.wheelhouse.target import Target

_REPACK_FORMAT = "1"  # bump when repacked wheels change: the cache is keyed on it
_REPACK_LEVEL = 1  # zlib: 3x faster than 6 on torch's 430 MB library, 15 % larger
_INSTALLER_FILES = ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")


def repack_installed(pins: list[Pin], target: Target, root: Path, paths: list[str] | None,
                      say: Say) -> dict[str, tuple[Path | None, str]]:
    """Repack the ``pins`` installed here at their version into wheels, in parallel
    (compression releases the GIL). ``{name: (wheel, "")}``, or ``(None, why)`` for one
    installed here but unfit for the node; pins not installed here are left out."""
    installed = _installed_dists(paths)
    jobs: dict[str, metadata.Distribution] = {}
    for pin in pins:
        dist = installed.get(pin.name)
        if pin.how == "download" and dist is not None and same_version(dist.version,
                                                                        pin.version):
            jobs[pin.name] = dist
    if not jobs:
        return {}
    say(f"repacking {len(jobs)} installed distribution(s) into wheels")
    accepted = target.tags()

    def one(dist: metadata.Distribution) -> tuple[Path | None, str]:
        try:
            return repack(dist, root, accepted), ""
        except WheelhouseError as error:
            return None, str(error)

    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return dict(zip(jobs, pool.map(one, jobs.values()), strict=True))
    except RuntimeError:  # a freeze finishing while the interpreter exits: one at a time
        return {name: one(dist) for name, dist in jobs.items()}


def _installed_dists(paths: list[str] | None) -> dict[str, metadata.Distribution]:
    """The installed (``.dist-info``) distributions, the first of each name as for import."""
    out: dict[str, metadata.Distribution] = {}
    found = metadata.distributions() if paths is None else metadata.distributions(path=paths)
    for dist in found:
        name = dist.metadata["Name"] if dist.metadata else None
        if name and lockfile.normalize(name) not in out and dist.read_text("WHEEL"):
            out[lockfile.normalize(name)] = dist
    return out


def installed_tags(dist: metadata.Distribution) -> frozenset[wheeltags.Tag]:
    """The wheel tags an installed distribution was built for (its ``WHEEL`` file)."""
    out: set[wheeltags.Tag] = set()
    for line in (dist.read_text("WHEEL") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "tag" and value.strip():
            out |= wheeltags.parse_tag(value.strip())
    return frozenset(out)


def repack(dist: metadata.Distribution, root: Path,
            accepted: frozenset[wheeltags.Tag] | None = None) -> Path:
    """A wheel rebuilt from an installed distribution's RECORD, kept in the cache under a
    fingerprint of that RECORD (so the same install is repacked once).

    Its tags are the ``WHEEL`` file's that ``accepted`` holds (pure Python without one);
    a regenerated RECORD hashes every file with sha256. Files outside site-packages go to
    ``.data/`` (scripts, headers, data) except console scripts, which the installer
    writes again from ``entry_points.txt``; anything outside the environment is dropped."""
    name = str(dist.metadata["Name"] or "")
    tags = installed_tags(dist) or frozenset(wheeltags.parse_tag("py3-none-any"))
    fitting = tags & accepted if accepted is not None else tags
    if not fitting:
        raise WheelhouseError(f"installed {name} {dist.version} is built for "
                              f"{', '.join(sorted(map(str, tags)))}, which does not run on the "
                              f"node")
    record = dist.read_text("RECORD")
    if record is None:
        raise WheelhouseError(f"cannot repack {name}: no RECORD")
    tag = _tag_string(fitting)
    fingerprint = hashlib.sha256("\0".join([_REPACK_FORMAT, record, tag,
                                            str(_REPACK_LEVEL)]).encode()).hexdigest()[:16]
    keep = root / "repacked" / fingerprint
    ready = sorted(keep.glob("*.whl")) if keep.is_dir() else []
    if ready:
        return ready[0]
    entries = _repack_entries(dist)
    filename = f"{lockfile.normalize(name).replace('-', '_')}-" \
               f"{dist.version.replace('-', '_')}-{tag}.whl"
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="repack-", dir=root) as tmp:
        path = Path(tmp) / filename
        _write_wheel(path, entries, _info_dir(dist))
        dest = keep / filename
        os.replace(path, dest)
        return dest


def _tag_string(tags: frozenset[wheeltags.Tag]) -> str:
    """The filename form of ``tags`` (``cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64``);
    one of them when they are not a product of their parts."""
    parts = [sorted({getattr(t, a) for t in tags}) for a in ("interpreter", "abi", "platform")]
    if len(parts[0]) * len(parts[1]) * len(parts[2]) == len(tags):
        return "-".join(".".join(p) for p in parts)
    return str(min(tags, key=str))


def _info_dir(dist: metadata.Distribution) -> str:
    record = next(str(f) for f in dist.files or [] if str(f).endswith(".dist-info/RECORD"))
    return record.rsplit("/", 1)[0]


def _repack_entries(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """``(name in the wheel, file here)`` for every installed file the wheel carries."""
    info = _info_dir(dist)
    data = info[: -len(".dist-info")] + ".data"
    base = Path(str(dist.locate_file(""))).resolve()
    prefix = base.parents[2] if base.parent.parent.name == "lib" and base.name in (
        "site-packages", "dist-packages") else None
    scripts = {e.name for e in dist.entry_points
               if e.group in ("console_scripts", "gui_scripts")}
    out = []
    for f in dist.files or []:
        rel = str(f)
        if rel.endswith((".pyc", ".pyo")) or "__pycache__" in rel or rel in {
                f"{info}/{n}" for n in _INSTALLER_FILES}:
            continue
        path = Path(os.path.normpath(base / rel))
        if not path.is_file():
            continue  # removed since it was installed: the environment lacks it too
        if not rel.startswith(".."):
            out.append((rel, path))
            continue
        placed = _data_name(path, prefix, base, scripts, data, lockfile.normalize(dist.name))
        if placed:
            out.append((placed, path))
    return out


def _data_name(path: Path, prefix: Path | None, base: Path, scripts: set[str], data: str,
               name: str) -> str | None:
    """Where a file installed outside site-packages goes in the wheel (``.data/``)."""
    if prefix is None:
        return None
    try:
        rel = path.relative_to(prefix)
    except ValueError:
        return None  # outside the environment
    head = rel.parts[0]
    if head == "bin":
        return None if path.name in scripts else f"{data}/scripts/{path.name}"
    if head == "include" and len(rel.parts) > 4 and rel.parts[1] == "site" and \
            lockfile.normalize(rel.parts[3]) == name:
        return f"{data}/headers/{'/'.join(rel.parts[4:])}"
    return f"{data}/data/{rel.as_posix()}"


def _write_wheel(path: Path, entries: list[tuple[str, Path]], info: str) -> None:
    """A deterministic zip (sorted, fixed times, modes kept), ``.dist-info`` last, RECORD
    regenerated with sha256 hashes."""
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    ordered = sorted(entries, key=lambda e: (e[0].startswith(f"{info}/"), e[0]))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=_REPACK_LEVEL) as wheel:
        for name, source in ordered:
            digest, size = _zip_file(wheel, name, source)
            writer.writerow([name, f"sha256={digest}", size])
        writer.writerow([f"{info}/RECORD", "", ""])
        wheel.writestr(_zip_info(f"{info}/RECORD", 0o644), record.getvalue())


def _zip_file(wheel: zipfile.ZipFile, name: str, source: Path) -> tuple[str, int]:
    st = source.stat()
    info = _zip_info(name, st.st_mode & 0o777)
    info.file_size = st.st_size
    digest = hashlib.sha256()
    script = "/scripts/" in name and ".data/" in name
    big = st.st_size > 1 << 30
    with source.open("rb") as f, wheel.open(info, "w", force_zip64=big) as out:
        first = True
        for chunk in iter(lambda: f.read(1 << 20), b""):
            if first and script:
                chunk = _python_shebang(chunk)
            first = False
            digest.update(chunk)
            out.write(chunk)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), info.file_size


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _python_shebang(chunk: bytes) -> bytes:
    """An installed script's ``#!/this/venv/bin/python`` back to ``#!python``, which the
    installer rewrites for the node's interpreter."""
    line, sep, rest = chunk.partition(b"\n")
    if line.startswith(b"#!") and b"python" in line:
        return b"#!python" + sep + rest
    return chunk

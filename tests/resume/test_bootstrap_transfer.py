"""The node bootstrap's downloads: ranged, several wheels at once, and resumable.

A wheel cut off in the middle (the fault proxy in front of SeaweedFS truncates its body)
continues with a ``Range: bytes=N-`` GET from the byte it reached, so the node fetches
about one wheel's bytes, not two; a ``.part`` file an earlier, killed setup left is
continued the same way, from ``file://`` and ``sftp://`` stores too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from burst.node import bootstrap
from tests.helpers.fault_proxy import FaultProxy, start
from tests.resume import test_bootstrap as base
from tests.resume.test_bootstrap import (
    SOURCE,
    assert_installed,
    publish,
    run_bootstrap,
    seaweed_env,
)

# the bootstrap tests' fixtures: its two wheels (burst's stand-in and a dependency), and
# a fresh prefix of SeaweedFS with the test credentials in the environment
wheels, s3_store = base.wheels, base.s3_store

PYTHON_37 = Path("/root/.pyenv/versions/3.7.16/bin/python3.7")


def payload(root: Path, name: str, size: int) -> tuple[Path, bytes]:
    """A wheel-named file of random bytes (the node fetches it; nothing installs it)."""
    data = os.urandom(size)
    path = root / f"{name}-0.0.1-py3-none-any.whl"
    path.write_bytes(data)
    return path, data


@pytest.fixture
def proxy(seaweed):
    faults = FaultProxy(seaweed.endpoint, seaweed.ca_bundle)
    server, endpoint = start(faults)
    try:
        yield faults, {**seaweed_env(seaweed), "BURST_ENDPOINT_URL": endpoint,
                       "BURST_CA_BUNDLE": ""}
    finally:
        server.shutdown()
        server.server_close()


def gets_of(faults: FaultProxy, name: str) -> list[tuple[str | None, int]]:
    """(Range header, body bytes served) of each GET of ``name``, in order."""
    return [(ranged, sent) for method, path, ranged, sent in faults.served
            if method == "GET" and f"/{name}" in path]


@pytest.mark.skipif(not os.path.exists(base.SYSTEM_PYTHON), reason="no /usr/bin/python3")
def test_a_node_download_cut_in_the_middle_of_a_wheel_resumes_from_the_byte_it_reached(
        tmp_path, wheels, s3_store, proxy):
    faults, env = proxy
    big, data = payload(tmp_path, "bigdata", (3 << 20) + 7)
    publish(s3_store, [*wheels, (big, "dependency")])
    faults.add("truncate", "GET", r"/wheels/[0-9a-f]{64}/bigdata-", times=1)
    done = run_bootstrap(tmp_path, s3_store, **env)
    assert done.returncode == 0, done.stderr
    half = len(data) // 2
    assert gets_of(faults, big.name) == [(None, half), (f"bytes={half}-", len(data) - half)]
    assert f"broke off at byte {half}" in done.stderr
    assert (tmp_path / "node" / "wheelhouse" / big.name).read_bytes() == data
    assert_installed(tmp_path)


def test_a_part_file_a_killed_setup_left_is_continued_with_a_range_get(tmp_path, s3_store,
                                                                        proxy):
    faults, env = proxy
    wheel, data = payload(tmp_path, "resumed", 1 << 20)
    index = publish(s3_store, [(wheel, "dependency")])
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{wheel.name}.part").write_bytes(data[:300_000])
    source = bootstrap.open_source(s3_store, env)
    assert bootstrap.download(source, index["wheels"], str(dest)) == (len(data) - 300_000, 0)
    assert gets_of(faults, wheel.name) == [("bytes=300000-", len(data) - 300_000)]
    assert (dest / wheel.name).read_bytes() == data
    assert not (dest / f"{wheel.name}.part").exists()


def test_a_part_file_of_other_bytes_is_fetched_again_from_byte_zero(tmp_path):
    wheel, data = payload(tmp_path, "stale", 200_000)
    index = publish(f"file://{tmp_path / 'store'}", [(wheel, "dependency")])
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{wheel.name}.part").write_bytes(os.urandom(50_000))  # an older build's bytes
    source = bootstrap.open_source(str(tmp_path / "store"), {})
    assert bootstrap.download(source, index["wheels"], str(dest)) == (len(data), 0)
    assert (dest / wheel.name).read_bytes() == data


@pytest.mark.skipif(not shutil.which("sftp"), reason="no OpenSSH sftp client")
def test_an_sftp_part_file_is_continued_where_it_stopped(tmp_path, sshd):
    wheel, data = payload(tmp_path, "viassh", 500_000)
    url = sshd.url()
    index = publish(url, [(wheel, "dependency")], ssh_config=str(sshd.config))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{wheel.name}.part").write_bytes(data[:123_456])
    source = bootstrap.open_source(url, {"BURST_SSH_CONFIG": str(sshd.config),
                                         "BURST_KNOWN_HOSTS": str(sshd.known_hosts)})
    assert bootstrap.download(source, index["wheels"], str(dest)) == (len(data) - 123_456, 0)
    assert (dest / wheel.name).read_bytes() == data


class Gate:
    """The real file source, whose fetches each wait until ``parties`` are in flight: a
    download that fetched one wheel after another would never get past the first."""

    def __init__(self, inner, parties: int) -> None:
        self.inner, self.where = inner, inner.where
        self.barrier = threading.Barrier(parties, timeout=30)

    def fetch(self, key: str, out, start: int = 0) -> None:
        self.barrier.wait()
        self.inner.fetch(key, out, start)


def test_wheels_are_fetched_several_at_once(tmp_path):
    files = [payload(tmp_path, f"w{i}", 10_000 + i) for i in range(bootstrap.WHEEL_WORKERS)]
    index = publish(f"file://{tmp_path / 'store'}", [(path, "dependency") for path, _ in files])
    source = Gate(bootstrap.open_source(str(tmp_path / "store"), {}), bootstrap.WHEEL_WORKERS)
    fetched, kept = bootstrap.download(source, index["wheels"], str(tmp_path / "dest"))
    assert (fetched, kept) == (sum(len(data) for _, data in files), 0)


@pytest.mark.skipif(not PYTHON_37.exists(), reason="no Python 3.7 on this machine (pyenv)")
def test_the_bootstrap_downloads_and_resumes_on_python_3_7(tmp_path):
    wheel, data = payload(tmp_path, "old", 300_000)
    publish(f"file://{tmp_path / 'store'}", [(wheel, "dependency")])
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{wheel.name}.part").write_bytes(data[:1000])
    script = tmp_path / "bootstrap.py"
    shutil.copy(SOURCE, script)
    sha = hashlib.sha256(data).hexdigest()
    code = ("import bootstrap as b\n"
            f"w = {{'file': {wheel.name!r}, 'sha256': {sha!r}, 'size': {len(data)},"
            f" 'key': 'wheels/{sha}/{wheel.name}'}}\n"
            f"print(b.download(b.open_source({str(tmp_path / 'store')!r}, {{}}), [w], "
            f"{str(dest)!r}))\n")
    done = subprocess.run([str(PYTHON_37), "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"({len(data) - 1000}, 0)"
    assert (dest / wheel.name).read_bytes() == data

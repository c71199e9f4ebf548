"""A SeaweedFS S3 server that knows two keys: one that may do anything, one read-only
(a fixture module: a test module imports ``two_key_s3`` to use it, once per session).

The session's ``seaweed`` fixture knows one admin key, and SeaweedFS reads ``-s3.config``
once at start (its IAM API refuses writes when a config file is given), so the read-only
identity needs its own small server: started once for this package's tests, on 127.0.0.1
with HTTPS, like the session's.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.store_servers import (
    ACCESS_KEY,
    BIN,
    BUCKET,
    SECRET_KEY,
    S3Server,
    free_port,
    stop,
    wait_until,
)

READ_ONLY_KEY, READ_ONLY_SECRET = "burst-read-only", "burst-read-only-secret"


def _weed() -> str:
    found = str(BIN / "weed") if (BIN / "weed").exists() else shutil.which("weed")
    if not found:
        pytest.skip("weed is not installed (pip install the test extra)")
    return found


@pytest.fixture(scope="session")
def two_key_s3(tmp_path_factory: pytest.TempPathFactory, tls_cert) -> Iterator[S3Server]:
    """``weed mini`` whose admin key is the usual test key and whose second key may only
    read and list (``READ_ONLY_KEY``)."""
    base = tmp_path_factory.mktemp("seaweed-two-keys")
    (base / "data").mkdir()
    identities = {"identities": [
        {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "reader", "credentials": [{"accessKey": READ_ONLY_KEY,
                                            "secretKey": READ_ONLY_SECRET}],
         "actions": ["Read", "List"]}]}
    (base / "s3.json").write_text(json.dumps(identities))
    https = free_port()
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
        "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")}
    cert, key = tls_cert
    args = [_weed(), "mini", f"-dir={base / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.port.https={https}",
            f"-s3.cert.file={cert}", f"-s3.key.file={key}", f"-s3.config={base / 's3.json'}",
            "-master.volumeSizeLimitMB=64", *(f"-{k}={v}" for k, v in ports.items())]
    log = base / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=base)
    server = S3Server(f"https://127.0.0.1:{https}", str(cert), process)

    def ready() -> bool:
        client = server.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)
        return True

    try:
        wait_until(ready, "weed mini (two keys)", process, log=log)
        yield server
    finally:
        stop(process)


def store_env(monkeypatch: pytest.MonkeyPatch, server: S3Server, tmp: Path,
              read_only: bool = False) -> None:
    """The store's settings as BURST_* variables and a key in the environment, nothing else
    (no config file, no profile, no home): what a user's shell would hold."""
    from tests.helpers.store_servers import aws_env

    aws_env(monkeypatch)
    if read_only:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", READ_ONLY_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READ_ONLY_SECRET)
    monkeypatch.setenv("BURST_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("BURST_CA_BUNDLE", str(server.ca_bundle))
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("HOME", str(tmp / "home"))

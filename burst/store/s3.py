"""S3 and S3-compatible stores through boto3: AWS, MinIO, Ceph, SeaweedFS, COS, OBS (and OSS).

Large objects go up as multipart uploads whose parts are sent in parallel, and come down
as parallel ranged GETs straight into the caller's buffer, so one big tensor uses many
connections. boto3's CRT transfer client is deliberately not used: it ignores
``endpoint_url`` and would send a MinIO or OSS snapshot to AWS.

Third-party endpoints get ``request_checksum_calculation`` and
``response_checksum_validation`` set to ``when_required``: since boto3 1.36 an HTTPS upload
otherwise goes out as ``aws-chunked`` with a trailing CRC, which OSS, COS, OBS (and rclone)
refuse with ``MissingContentLength`` or store with the chunk framing inside the object.
Payloads are not SHA-256-signed over HTTPS: TLS protects them in transit, and burst names
every blob by its own SHA-256 and checks it on every read, so signing would only hash
each byte a second time.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.config
import botocore.exceptions as bexc
import botocore.parsers

from burst import killpoints
from burst.errors import ConfigError, StoreError
from burst.store.base import TransientStoreError, addressable, check_key, check_prefix
from burst.store.settings import as_bool, as_int

DEFAULT_PART_SIZE = 32 << 20
DEFAULT_WORKERS = 8
MAX_PARTS = 10_000
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,62}$")
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                    "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                    "OperationAborted", "ConditionalRequestConflict"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
                 "InvalidToken", "ExpiredToken", "AllAccessDisabled"}


def parse_bucket_url(url: str, scheme: str) -> tuple[str, str]:
    """``scheme://bucket/some/prefix`` → (bucket, ``some/prefix/``); malformed ones refused."""
    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket: use {scheme}://BUCKET[/PREFIX]")
    if not _BUCKET.match(bucket) or parsed.query or parsed.fragment or "@" in bucket:
        raise ConfigError(f"{url!r}: {bucket!r} is not a valid bucket name")
    if prefix:
        check_key(prefix)
    return bucket, f"{prefix}/" if prefix else ""


def is_aws_endpoint(endpoint: str | None) -> bool:
    """True for AWS itself (no endpoint, or an amazonaws.com host): checksums stay on there."""
    if not endpoint:
        return True
    host = urlparse(endpoint).hostname or ""
    return host == "amazonaws.com" or host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def make_client(options: dict[str, Any], *, addressing_style: str = "auto",
                credentials: dict[str, str] | None = None) -> Any:
    """A boto3 S3 client for ``options`` (endpoint_url, region, profile, ca_bundle, ...)."""
    endpoint = options.get("endpoint_url")
    when = "when_supported" if is_aws_endpoint(endpoint) else "when_required"
    workers = as_int(options, "workers", DEFAULT_WORKERS)
    config = botocore.config.Config(
        s3={"addressing_style": options.get("addressing_style", addressing_style),
            "payload_signing_enabled": as_bool(options, "payload_signing", False)},
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=workers * 4,
        connect_timeout=10,
        read_timeout=120,
        request_checksum_calculation=when,
        response_checksum_validation=when,
        signature_version="s3v4",
    )
    try:
        session = boto3.session.Session(profile_name=options.get("profile"),
                                        **(credentials or {}))
    except bexc.ProfileNotFound as exc:
        raise ConfigError(f"AWS profile not found: {exc}") from None
    return session.client("s3", endpoint_url=endpoint, region_name=options.get("region"),
                          config=config, verify=options.get("ca_bundle") or None)


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview, so botocore can send (and re-send) it uncopied."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), len(self._view) - self._pos)
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


class S3Store:
    """Objects under ``s3://bucket/prefix/``; keys are relative to the prefix."""

    scheme = "s3"

    def __init__(self, bucket: str, prefix: str, client: Any, *, url: str | None = None,
                 part_size: int = DEFAULT_PART_SIZE, workers: int = DEFAULT_WORKERS) -> None:
        self.bucket, self.prefix, self.client = bucket, prefix, client
        self.url = url or f"{self.scheme}://{bucket}/{prefix}".rstrip("/")
        self.part_size, self.workers = max(part_size, 5 << 20), workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.endpoint = client.meta.endpoint_url

    @classmethod
    def from_url(cls, url: str, options: dict[str, Any]) -> S3Store:
        bucket, prefix = parse_bucket_url(url, cls.scheme)
        return cls(bucket, prefix, make_client(options), url=url.rstrip("/"),
                   part_size=as_int(options, "part_size", DEFAULT_PART_SIZE),
                   workers=as_int(options, "workers", DEFAULT_WORKERS))

    # -- the Store protocol ---------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        if len(view) > self.part_size:
            self._put_multipart(key, view)
            return
        killpoints.hit("s3.put")
        with self._errors(f"writing {key}"):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=_ViewReader(view))
        killpoints.hit("s3.put.done")

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        if self.size(key) is not None:  # servers that ignore If-None-Match still get a check
            return False
        view = memoryview(data).cast("B")
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=_ViewReader(view),
                                   IfNoneMatch="*")
        except bexc.ClientError as exc:
            if _status(exc) in (409, 412) and _code(exc) != "NoSuchBucket":
                return False  # 412 PreconditionFailed (S3), 409 FileAlreadyExists (OSS)
            raise self._translate(exc, f"writing {key}") from None
        except bexc.BotoCoreError as exc:
            raise self._translate(exc, f"writing {key}") from None
        return True

    def get(self, key: str) -> bytes:
        with self._errors(f"reading {key}"):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except bexc.ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    raise KeyError(key) from None
                raise
            return response["Body"].read()

    def read_into(self, key: str, buffer: memoryview) -> int:
        size = self.size(key)
        if size is None:
            raise KeyError(key)
        wanted = min(size, len(buffer))
        ranges = list(_ranges(wanted, self.part_size))
        if len(ranges) <= 1:
            if wanted:
                self._get_range(key, buffer[:wanted], 0)
            return size
        pool = self._executor()
        futures = [pool.submit(self._get_range, key, buffer[a:b], a) for a, b in ranges]
        for future in futures:
            future.result()
        return size

    def size(self, key: str) -> int | None:
        with self._errors(f"checking {key}"):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            except bexc.ClientError as exc:
                if _status(exc) == 404:
                    return None
                raise
            return int(head["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        check_prefix(prefix)
        with self._errors(f"listing {prefix or '/'}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            for page in pages:
                keys.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", ()))
        return addressable(keys)

    def delete(self, key: str) -> None:
        with self._errors(f"deleting {key}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    # -- multipart and ranges ----------------------------------------------------------

    def _put_multipart(self, key: str, view: memoryview) -> None:
        part = max(self.part_size, math.ceil(len(view) / MAX_PARTS))
        full = self._key(key)
        with self._errors(f"writing {key}"):
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]
        try:
            pool = self._executor()
            futures = [pool.submit(self._put_part, full, upload, number, view[a:b])
                       for number, (a, b) in enumerate(_ranges(len(view), part), start=1)]
            parts = [{"PartNumber": n, "ETag": f.result()} for n, f in enumerate(futures, 1)]
            killpoints.hit("s3.multipart.parts-done")
            with self._errors(f"writing {key}"):
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=full,
                                                      UploadId=upload,
                                                      MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(Exception):  # leave no orphaned parts to pay for
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
            raise

    def _put_part(self, full_key: str, upload: str, number: int, view: memoryview) -> str:
        killpoints.hit("s3.multipart.part")
        with self._errors(f"writing part {number} of {full_key}"):
            response = self.client.upload_part(Bucket=self.bucket, Key=full_key,
                                               UploadId=upload, PartNumber=number,
                                               Body=_ViewReader(view))
        return response["ETag"]

    def _get_range(self, key: str, view: memoryview, start: int) -> None:
        end = start + len(view) - 1
        with self._errors(f"reading {key}"):
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                              Range=f"bytes={start}-{end}")
            body, filled = response["Body"], 0
            while filled < len(view):
                chunk = body.read(min(8 << 20, len(view) - filled))
                if not chunk:
                    raise TransientStoreError(f"{self.url}: {key} ended early while reading")
                view[filled : filled + len(chunk)] = chunk
                filled += len(chunk)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="burst-s3")
            return self._pool

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    # -- errors -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (bexc.ClientError, bexc.BotoCoreError) as exc:
            raise self._translate(exc, what) from None

    def _translate(self, exc: Exception, what: str) -> StoreError:
        """One line a user can act on; TransientStoreError for what a retry may fix."""
        where = f"{self.url} ({self.endpoint})"
        if isinstance(exc, bexc.NoCredentialsError):
            return StoreError(f"{where}: no credentials found: set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or a profile")
        if isinstance(exc, bexc.SSLError):
            return StoreError(f"{where}: TLS verification failed: trust the server's "
                              "certificate with AWS_CA_BUNDLE or the ca_bundle setting")
        if isinstance(exc, bexc.ClientError):
            code, status = _code(exc), _status(exc)
            if code == "NoSuchBucket":
                return StoreError(f"{where}: bucket {self.bucket!r} does not exist")
            if code in _DENIED_CODES or status == 403:
                return StoreError(f"{where}: access denied while {what} ({code}): check the "
                                  "credentials and their permissions")
            if code in _TRANSIENT_CODES or (status or 0) >= 500 or status == 429:
                return TransientStoreError(f"{where}: {what}: {code} (HTTP {status})")
            message = exc.response.get("Error", {}).get("Message") or code
            return StoreError(f"{where}: {what} failed: {code}: {_one_line(message)}")
        if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectionClosedError,
                            bexc.ReadTimeoutError, bexc.ConnectTimeoutError,
                            bexc.HTTPClientError, bexc.ConnectionError)):
            return TransientStoreError(f"{where}: cannot reach the endpoint while {what}: "
                                       f"{_one_line(str(exc))}")
        if isinstance(exc, _DAMAGED_IN_TRANSIT):  # a body cut short or garbled: ask again
            return TransientStoreError(f"{where}: {what}: the response was damaged in "
                                       f"transit ({_one_line(str(exc))})")
        return StoreError(f"{where}: {what} failed: {_one_line(str(exc))}")


_DAMAGED_IN_TRANSIT = (bexc.IncompleteReadError, bexc.ChecksumError,
                       getattr(bexc, "FlexibleChecksumError", bexc.ChecksumError),
                       botocore.parsers.ResponseParserError)


def _ranges(size: int, part: int) -> Iterator[tuple[int, int]]:
    for start in range(0, size, part):
        yield start, min(start + part, size)


def _code(exc: bexc.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: bexc.ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _one_line(text: str) -> str:
    return " ".join(text.split())

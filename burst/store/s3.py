"""S3 and S3-compatible stores through boto3: AWS, MinIO, Ceph, SeaweedFS, COS, OBS (and OSS).

Large objects go up as multipart uploads whose parts are sent in parallel, and come down
as parallel ranged GETs straight into the caller's buffer, so one big tensor uses many
connections. :meth:`S3Store.read_parts` hands each downloaded part over in order as soon as
it has landed, so a pull hashes part k while parts k+1... are still on the wire, and
retries a cut-off part on its own instead of the whole object. boto3's CRT transfer client is deliberately not used: it ignores
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

import builtins  # in the store's class body `list` names its method, not the type
import contextlib
import hashlib
import io
import math
import mmap
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlparse, urlsplit, urlunsplit

import boto3
import botocore.config
import botocore.exceptions as bexc
import botocore.parsers

from burst import killpoints
from burst.errors import ConfigError, SnapshotError, StoreError
from burst.store.base import (
    Pace,
    TransientStoreError,
    addressable,
    check_key,
    check_prefix,
    check_range,
)
from burst.store.retry import DEFAULT_RETRY, RetryPolicy, retry
from burst.store.settings import as_bool, as_int

DEFAULT_PART_SIZE = 32 << 20
# Downloads use smaller parts than uploads: more of them run at once for one blob, the
# first lands (and its hashing starts) sooner, and a cut-off part costs less to re-fetch.
# 16 MiB pulled faster than 8 (more requests, each with botocore's overhead) or 32 MiB
# (scripts/bench_store.py, SeaweedFS).
GET_PART_SIZE = 16 << 20
READ_CHUNK = 256 << 10  # read from the socket this much at a time: the copy stays in cache
Write = Callable[[int, bytes], None]  # (offset in the object, bytes): lands one chunk
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
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
                credentials: dict[str, str] | None = None, bucket: str | None = None,
                botocore_session: Any = None) -> Any:
    """A boto3 S3 client for ``options`` (endpoint_url, region, profile, ca_bundle, ...).

    With ``bucket_endpoint`` the endpoint is bound to ``bucket`` (a custom domain, as
    Alibaba requires of new accounts for mainland buckets): requests go to
    ``<endpoint>/<key>``, with the bucket in neither host nor path."""
    endpoint = options.get("endpoint_url")
    bound = as_bool(options, "bucket_endpoint", False)
    if bound:
        if not endpoint or not bucket:
            raise ConfigError("bucket_endpoint needs endpoint_url: the bucket's own domain "
                              "(e.g. https://ckpt.example.com)")
        addressing_style = "path"  # the bucket is then the first path segment: cut below
    when = "when_supported" if is_aws_endpoint(endpoint) else "when_required"
    workers = as_int(options, "workers", DEFAULT_WORKERS)
    config = botocore.config.Config(
        s3={"addressing_style": addressing_style if bound
            else options.get("addressing_style", addressing_style),
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
                                        botocore_session=botocore_session,
                                        **(credentials or {}))
    except bexc.ProfileNotFound as exc:
        raise ConfigError(f"AWS profile not found: {exc}") from None
    client = session.client("s3", endpoint_url=endpoint, region_name=options.get("region"),
                            config=config, verify=options.get("ca_bundle") or None)
    if bound:
        assert bucket is not None and endpoint is not None
        unbind = _BucketPathCut(urlparse(endpoint).path.rstrip("/"), bucket)
        client.meta.events.register("before-sign.s3", unbind)
    return client


def bucket_region(store: S3Store) -> str | None:
    """The region the store's bucket lives in, as S3 says it: HeadBucket's
    ``x-amz-bucket-region`` header (AWS sends it even when refusing a request signed for
    another region), else, on AWS, GetBucketLocation. boto3 follows a bucket's region here
    on its own; a node's bootstrap signs for the region it is given, so ``burst resume``
    asks. None when the endpoint does not say (most S3-compatible servers) or cannot be
    asked."""
    try:
        response = store.client.head_bucket(Bucket=store.bucket)
    except bexc.ClientError as exc:
        response = exc.response
    except bexc.BotoCoreError:
        return None
    region = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
        "x-amz-bucket-region")
    if region:
        return str(region)
    if not is_aws_endpoint(store.endpoint):  # Ceph's zonegroup, GCS's "US": not regions
        return None
    try:
        location = store.client.get_bucket_location(Bucket=store.bucket).get(
            "LocationConstraint")
    except (bexc.ClientError, bexc.BotoCoreError):
        return None
    if location == "EU":  # the legacy name of eu-west-1
        return "eu-west-1"
    return str(location) if location else "us-east-1"


class _BucketPathCut:
    """Drop ``/<bucket>`` from a path-style URL before it is signed, so the request (and
    its SigV4 signature) names ``<endpoint>/<key>``: what a bucket-bound domain serves."""

    def __init__(self, base: str, bucket: str) -> None:
        self.prefix = f"{base}/{quote(bucket, safe='')}"
        self.base = base

    def __call__(self, request: Any, **_: Any) -> None:
        parts = urlsplit(request.url)
        path = parts.path
        if path == self.prefix or path.startswith(self.prefix + "/"):
            path = self.base + (path[len(self.prefix):] or "/")
            request.url = urlunsplit((parts.scheme, parts.netloc, path, parts.query,
                                      parts.fragment))


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
        self.get_part_size = GET_PART_SIZE  # ranged GETs have no minimum part size
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.endpoint = client.meta.endpoint_url

    @classmethod
    def from_url(cls, url: str, options: dict[str, Any]) -> S3Store:
        bucket, prefix = parse_bucket_url(url, cls.scheme)
        return cls(bucket, prefix, make_client(options, bucket=bucket), url=url.rstrip("/"),
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

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """Upload the file at ``path``: one PUT up to a part's size, else a multipart
        upload whose parts go in parallel from a read-only map of the file (the page cache
        holds it, not this process's heap), continuing an upload a failed or killed try
        of the same key left open (:meth:`_open_upload`)."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= self.part_size:
                if pace is not None:
                    pace(size)
                self.put(key, f.read())  # one part's worth at most
                return
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        try:
            with memoryview(mapped) as view:
                self._put_multipart(key, view, resume=True, pace=pace)
        finally:
            with contextlib.suppress(BufferError):  # a part's slice may outlive a failure
                mapped.close()

    def put_checked(self, key: str, data: bytes | bytearray | memoryview,
                    check: Callable[[], None]) -> None:
        """Write ``data`` under ``key`` only if ``check()`` returns (it raises to refuse).

        A multipart upload runs the check beside its parts and completes only after it
        passed: a push hashes a blob while sending it, yet a blob whose bytes do not match
        its name never becomes visible (a failed check aborts the upload). A small object
        is checked first: one PUT, nothing to overlap."""
        view = memoryview(data).cast("B")
        if len(view) > self.part_size:
            self._put_multipart(key, view, check)
            return
        check()
        self.put(key, view)

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
        write = _into(buffer)
        ranges = list(_ranges(wanted, self.get_part_size))
        if len(ranges) <= 1:
            if wanted:
                self._get_range(key, 0, wanted, write)
            return size
        pool = self._executor()
        futures = [pool.submit(self._get_range, key, a, b - a, write) for a, b in ranges]
        _settle(futures)
        return size

    def read_parts(self, key: str, size: int, write: Write, *,
                   policy: RetryPolicy = DEFAULT_RETRY) -> Iterator[tuple[int, int]]:
        """Download the object ``key``, which must be ``size`` bytes, by ranged GETs in
        parallel, handing its bytes to ``write(offset, data)`` (from the pool's threads);
        yield each part's ``(start, end)``, in order, once it has been written.

        No HEAD first: every part's ``Content-Range`` names the object's size, and a size
        other than ``size`` raises :class:`~burst.errors.SnapshotError` (the caller took it
        from a manifest). A missing object raises ``KeyError``. Each part is retried on
        its own through ``policy`` (it is written again from its start). If the caller
        stops early, parts not yet started are cancelled and running ones finish before
        this returns, so ``write`` is never called afterwards.
        """
        if not size:
            actual = self.size(key)
            if actual is None:
                raise KeyError(key)
            if actual:
                raise SnapshotError(f"{key} is not the 0 bytes expected in {self.url} "
                                    f"(the server reports {actual})")
            return
        pool = self._executor()

        def part(a: int, b: int) -> None:
            total = retry(lambda: self._get_range(key, a, b - a, write), policy)
            if total != size:
                raise SnapshotError(f"{key} is not the {size} bytes expected in {self.url} "
                                    f"(the server reports {total})")

        ranges = list(_ranges(size, self.get_part_size))
        futures = [pool.submit(part, a, b) for a, b in ranges]
        try:
            for (a, b), future in zip(ranges, futures, strict=True):
                future.result()
                yield a, b
        finally:
            _settle(futures, cancel=True)

    def read_range(self, key: str, start: int, length: int, *,
                   policy: RetryPolicy = DEFAULT_RETRY) -> bytes | bytearray:
        """Ranged GETs (a long range in parallel parts), each retried on its own through
        ``policy``; no HEAD first: every part's ``Content-Range`` tells the object's size.
        Returns a ``bytearray`` (filled in place by the parts)."""
        if not length or start < 0:
            size = self.size(key)
            if size is None:
                raise KeyError(key)
            check_range(self.url, key, start, length, size)
            return b""
        filled = bytearray(length)
        out = memoryview(filled)

        def write(offset: int, data: bytes) -> None:
            out[offset - start : offset - start + len(data)] = data

        def part(a: int, b: int) -> None:
            total = retry(lambda: self._get_range(key, a, b - a, write), policy)
            if total < start + length:
                raise StoreError(f"{self.url}: {key} ends before byte {start + length} that a "
                                 f"read of bytes {start}..{start + length} needs")

        ranges = [(start + a, start + b) for a, b in _ranges(length, self.get_part_size)]
        if len(ranges) == 1:
            part(*ranges[0])
        else:
            _settle([self._executor().submit(part, a, b) for a, b in ranges])
        return filled  # the parts wrote into it in place

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

    def _put_multipart(self, key: str, view: memoryview,
                       check: Callable[[], None] | None = None, *, resume: bool = False,
                       pace: Pace | None = None) -> None:
        """Send ``view`` as a multipart upload, its parts in parallel, completed only once
        every part (and ``check``, beside them) succeeded.

        Without ``resume`` a failure aborts the upload (no orphaned parts to pay for). With
        it (:meth:`put_file`) the upload stays open on failure and the next try of the same
        key continues it (:meth:`_open_upload`): a 900 MB wheel cut at 80% sends 20% again."""
        part = max(self.part_size, math.ceil(len(view) / MAX_PARTS))
        full = self._key(key)
        ranges = list(enumerate(_ranges(len(view), part), start=1))
        upload, landed = (self._open_upload(key, full, view, ranges) if resume
                          else (self._create_upload(key, full), {}))
        try:
            pool = self._executor()
            checked = pool.submit(check) if check is not None else None  # beside the parts
            futures = {number: pool.submit(self._put_part, full, upload, number, view[a:b],
                                           pace)
                       for number, (a, b) in ranges if number not in landed}
            _settle(list(futures.values()))  # every part has stopped reading ``view``
            parts = [{"PartNumber": n, "ETag": landed.get(n) or futures[n].result()}
                     for n, _ in ranges]
            if checked is not None:
                checked.result()  # raises: the upload is aborted below, nothing visible
            killpoints.hit("s3.multipart.parts-done")
            self._complete(key, full, upload, parts, len(view) if resume else None)
        except BaseException:
            if not resume:
                with contextlib.suppress(Exception):  # leave no orphaned parts to pay for
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=full,
                                                       UploadId=upload)
            raise

    def _create_upload(self, key: str, full: str) -> str:
        with self._errors(f"writing {key}"):
            return self.client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]

    def _complete(self, key: str, full: str, upload: str, parts: builtins.list[dict],
                  resumed_size: int | None) -> None:
        try:
            with self._errors(f"writing {key}"):
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=full,
                                                      UploadId=upload,
                                                      MultipartUpload={"Parts": parts})
        except TransientStoreError:
            raise
        except StoreError:
            # a racing writer of the same key continued this upload and completed it first
            # (NoSuchUpload): its parts were ours, byte for byte (their MD5s matched)
            if resumed_size is None or self.size(key) != resumed_size:
                raise

    def _open_upload(self, key: str, full: str, view: memoryview,
                     ranges: builtins.list[tuple[int, tuple[int, int]]]
                     ) -> tuple[str, dict[int, str]]:
        """The newest upload of ``full`` an earlier try left open, and its parts whose
        size and MD5 (the ETag S3 gives a part) match ours; else a new upload.

        The server is asked (ListMultipartUploads, ListParts) rather than a local record
        kept: a try killed with SIGKILL, or made from another machine, leaves nothing
        behind but the upload itself, and a part is kept only if its bytes are ours."""
        try:
            with self._errors(f"looking for an unfinished upload of {key}"):
                listed = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=full)
                open_ = sorted((u for u in listed.get("Uploads", ()) if u.get("Key") == full),
                               key=lambda u: str(u.get("Initiated", "")))
                if not open_:
                    return self._create_upload(key, full), {}
                upload = open_[-1]["UploadId"]
                pages = self.client.get_paginator("list_parts").paginate(
                    Bucket=self.bucket, Key=full, UploadId=upload)
                listed_parts = {p["PartNumber"]: p for page in pages
                                for p in page.get("Parts", ())}
        except TransientStoreError:
            raise
        except StoreError:  # a server without these calls: start afresh
            return self._create_upload(key, full), {}
        landed = {}
        for number, (a, b) in ranges:
            found = listed_parts.get(number)
            if found is not None and int(found.get("Size", -1)) == b - a and \
                    str(found.get("ETag", "")).strip('"') == _md5(view[a:b]):
                landed[number] = found["ETag"]
        return upload, landed

    def _put_part(self, full_key: str, upload: str, number: int, view: memoryview,
                  pace: Pace | None = None) -> str:
        if pace is not None:
            pace(len(view))
        killpoints.hit("s3.multipart.part")
        with self._errors(f"writing part {number} of {full_key}"):
            response = self.client.upload_part(Bucket=self.bucket, Key=full_key,
                                               UploadId=upload, PartNumber=number,
                                               Body=_ViewReader(view))
        return response["ETag"]

    def _get_range(self, key: str, start: int, length: int, write: Write) -> int:
        """GET ``length`` bytes of ``key`` from ``start``, handing them to ``write`` a
        chunk at a time; return the object's whole size (from ``Content-Range``, so a
        range past its end is not an error here: the caller compares sizes). A missing
        key raises ``KeyError``."""
        end = start + length - 1
        with self._errors(f"reading {key}"):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                                  Range=f"bytes={start}-{end}")
            except bexc.ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    raise KeyError(key) from None
                if _code(exc) == "InvalidRange":
                    return start  # the object ends before this part
                raise
            body, filled = response["Body"], 0
            if start and not response.get("ContentRange"):
                body.close()  # a whole object from 0, not the part asked for
                raise StoreError(f"{self.url}: the server ignored the Range of a GET of "
                                 f"{key}: it cannot be read in parts")
            total = _total_size(response, start + length)
            if total < start + length:
                body.close()
                return total
            while filled < length:
                chunk = body.read(min(READ_CHUNK, length - filled))
                if not chunk:
                    raise TransientStoreError(f"{self.url}: {key} ended early while reading")
                write(start + filled, chunk)
                filled += len(chunk)
            return total

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
        if isinstance(exc, bexc.ConnectionError):  # no connection made: unreachable
            return TransientStoreError(f"{where}: cannot reach the endpoint while {what}: "
                                       f"{_one_line(str(exc))}")
        if isinstance(exc, bexc.ReadTimeoutError):
            return TransientStoreError(f"{where}: the endpoint stopped answering while "
                                       f"{what}: {_one_line(str(exc))}")
        if isinstance(exc, bexc.HTTPClientError):  # reached, then cut off (a body cut short)
            return TransientStoreError(f"{where}: the connection broke while {what}: "
                                       f"{_one_line(str(exc))}")
        if isinstance(exc, _DAMAGED_IN_TRANSIT):  # a body cut short or garbled: ask again
            return TransientStoreError(f"{where}: {what}: the response was damaged in "
                                       f"transit ({_one_line(str(exc))})")
        return StoreError(f"{where}: {what} failed: {_one_line(str(exc))}")


_DAMAGED_IN_TRANSIT = (bexc.IncompleteReadError, bexc.ChecksumError,
                       getattr(bexc, "FlexibleChecksumError", bexc.ChecksumError),
                       botocore.parsers.ResponseParserError)


def _into(buffer: memoryview) -> Write:
    """A ``Write`` that copies each chunk into ``buffer`` at its offset."""

    def write(offset: int, data: bytes) -> None:
        buffer[offset : offset + len(data)] = data

    return write


def _total_size(response: dict, fallback: int) -> int:
    """The object's size from a ranged GET's ``Content-Range`` (``bytes a-b/total``)."""
    match = _CONTENT_RANGE.fullmatch(response.get("ContentRange") or "")
    return int(match.group(3)) if match else fallback


def _settle(futures: list[Future], cancel: bool = False) -> None:
    """Wait for every part to stop writing into the shared buffer; raise the first failure.

    After a failure (or with ``cancel``: the caller is already leaving) the parts not yet
    started are cancelled; running ones cannot be, and are waited for. With ``cancel``
    nothing is raised: the caller's own exception is the one that matters."""
    if cancel:
        for future in futures:
            future.cancel()
    error: BaseException | None = None
    for future in futures:
        if future.cancelled():
            continue
        exc = future.exception()
        if exc is not None and error is None:
            error = exc
            for other in futures:
                other.cancel()
    if error is not None and not cancel:
        raise error


def _md5(view: memoryview) -> str:
    """A part's MD5, as S3 names it in its ETag (not for security: to know it is ours)."""
    return hashlib.md5(view, usedforsecurity=False).hexdigest()


def _ranges(size: int, part: int) -> Iterator[tuple[int, int]]:
    for start in range(0, size, part):
        yield start, min(start + part, size)


def _code(exc: bexc.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: bexc.ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _one_line(text: str) -> str:
    return " ".join(text.split())

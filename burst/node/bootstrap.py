"""Put burst on a bare node with nothing but ``python3``'s standard library.

The task's ``setup`` writes this file out of a heredoc and runs it with the node's
``python3`` (3.7 or newer: the shell part checks that first, so an Alibaba Cloud Linux 3 or
RHEL 8 node's 3.6 gets one line, not a SyntaxError) before anything is installed, so it imports nothing from burst and nothing outside the standard library. It:

1. finds the interpreter the run's lockfile names (``$BURST_PYTHON``, e.g. ``3.11``:
   ``python3.11`` on PATH, or one ``uv`` already has);
2. reads the run's wheelhouse index (``<run>/env/wheelhouse-<$BURST_LOCKFILE_DIGEST>.json``)
   from the run's store; a node without that Python gets it from the store (a standalone
   build the index names, ``python/<sha256>/<file>``, hash-checked and unpacked under
   ``$BURST_NODE_DIR/python``) or installs it with uv (the node's, or the one in the
   wheelhouse; ``$BURST_PYTHON_MIRROR`` for a mirror of python-build-standalone), and
   stops in one line, before any download, when there is no way;
3. fetches every wheel the index lists (``wheels/<sha256>/<file>``) into
   ``$BURST_NODE_DIR/wheelhouse`` (the index beside them, as ``wheelhouse.json``),
   checking each file's SHA-256 (a file already there with the right hash is kept: a
   recovered node, and ``burst node setup`` after it, fetch nothing twice); four wheels
   come down at once, each through ``<file>.part``, which a transfer that breaks off, or
   a setup run again after a kill, continues from its size (``Range: bytes=N-`` on S3,
   ``reget`` over sftp, a seek in a directory) with the hash still over the whole file;
4. creates the node's one venv, ``$BURST_NODE_DIR/venv``, with that interpreter (pip from
   ensurepip where the OS ships it, else ``--without-pip`` and pip run from its wheel);
5. installs burst's own wheel and, through it, its dependencies (torch already in the
   build the target card needs) with ``pip install --no-index --find-links``; a forwarded
   package mirror (``$BURST_INDEX_URL``, ``$BURST_EXTRA_INDEX_URL``, ``$BURST_TORCH_INDEX``)
   is tried only when the wheelhouse alone cannot satisfy it.

``burst node setup`` then runs from that venv and installs the rest of the lockfile into it.

Stores: ``file://`` (and plain paths), ``s3://`` (AWS or any S3-compatible endpoint:
``$BURST_ENDPOINT_URL``, ``$AWS_ENDPOINT_URL``; ``$BURST_REGION``; ``$BURST_CA_BUNDLE``;
``$BURST_ADDRESSING_STYLE``), ``oss://`` (Alibaba Cloud through its S3-compatible API) and
``sftp://`` (the system's OpenSSH ``sftp``/``scp``). Credentials come from the task's
secrets in the environment and are only ever held in memory; with
``$BURST_NODE_IDENTITY=own`` and no keys, from the node's own role (AWS IMDSv2, a
web-identity token through STS, Alibaba's ECS RAM role). An S3 bucket in another region
than the one signed for is followed once, to the region its error names.

Why a hand-written S3 client: boto3 is exactly what this script is installing, and pip
cannot fetch it from a node that reaches no package index (mainland China, air-gapped
labs). Reading objects needs only a signed GET, so a minimal AWS Signature Version 4
signer on ``urllib`` is the one hand-written client burst has; everything after the
bootstrap uses the real SDKs. Keep this file parseable by Python 3.7 so that an old
``python3`` reaches the version check and says so in one line instead of a SyntaxError.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import platform
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

MIN_PYTHON = (3, 10)  # what burst itself runs on: the venv's interpreter
RUN_PYTHON = (3, 7)  # what this file runs on (the shell part of the task checks it first)
INTERPRETER_FIELD = "interpreter"  # the wheelhouse index's shipped standalone Python
PYTHON_MIRROR_ENV = "BURST_PYTHON_MIRROR"  # uv's UV_PYTHON_INSTALL_MIRROR, for the node
PYTHON_DOWNLOADS_ENV = "BURST_PYTHON_DOWNLOADS"  # uv's UV_PYTHON_DOWNLOADS_JSON_URL
INDEX_FORMAT = 1
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
CHUNK = 1 << 20
ATTEMPTS = 3
# Wheels fetched at once: a CUDA wheelhouse is a handful of 0.3-0.9 GB wheels, and four
# streams keep a long, lossy link busy where one stream waits on its own window.
WHEEL_WORKERS = 4
CUT = (OSError, urllib.error.URLError, http.client.HTTPException)  # a transfer broke off
INDEX_FILE = "wheelhouse.json"  # beside the wheels, as burst.env.wheelhouse.download leaves it
PIP_MODE_ENV = "BURST_BOOTSTRAP_PIP"  # "wheel": skip ensurepip (tests, odd images)


class BootstrapError(Exception):
    """A one-line reason the node cannot be set up; ``code`` 2 for what the user must fix
    before anything can be fetched, 1 for a failure along the way."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class NotFound(Exception):
    """The store has no object under that key."""


def say(message: str) -> None:
    print(f"burst bootstrap: {message}", file=sys.stderr, flush=True)


# -- the interpreter ------------------------------------------------------------------------


def check_running_python(version: tuple = tuple(sys.version_info[:2])) -> None:
    """This file runs on 3.7 or newer (the task's shell refuses older ones in one line);
    the interpreter it builds the venv with is the lock's, found or fetched below."""
    if tuple(version) < RUN_PYTHON:
        raise BootstrapError(
            f"python3 here is {version[0]}.{version[1]}; burst's bootstrap needs 3.7 or "
            "newer to run (use an image with a newer python3, e.g. Ubuntu 22.04)", 2)


def python_version_of(executable: str) -> str | None:
    """``major.minor`` of an interpreter, or None when it does not run."""
    try:
        done = subprocess.run(
            [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(wanted: str, environ: dict) -> str | None:
    """The node's own interpreter for the lock's ``major.minor`` (``wanted``; empty: this
    one, when it is new enough for burst); None when the node has none."""
    here = "{}.{}".format(*sys.version_info[:2])
    if not wanted:
        return sys.executable if tuple(sys.version_info[:2]) >= MIN_PYTHON else None
    if wanted == here:
        return sys.executable
    path = environ.get("PATH", os.defpath)
    candidates = [shutil.which(f"python{wanted}", path=path)]
    candidates += [f"{d}/python{wanted}" for d in ("/usr/bin", "/usr/local/bin", "/opt/conda/bin")]
    candidates += [shutil.which("python3", path=path), shutil.which("python", path=path)]
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and python_version_of(candidate) == wanted:
            return candidate
    uv = shutil.which("uv", path=path)
    found = _uv_find(uv, wanted, environ) if uv else None
    return found


def _uv_find(uv: str, wanted: str, environ: dict) -> str | None:
    try:
        done = subprocess.run([uv, "python", "find", "--managed-python", "--no-project",
                               "--no-config", wanted], capture_output=True, text=True,
                              timeout=120, check=False, env=environ)
    except (OSError, subprocess.SubprocessError):
        return None
    found = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() \
        else ""
    return found if found and python_version_of(found) == wanted else None


def python_way(wanted: str, index: dict, environ: dict) -> str:
    """How a node without the lock's Python gets it, decided before any download:
    ``shipped`` (a standalone build in the store, named by the wheelhouse index) or ``uv``
    (installed with uv, from python-build-standalone or ``$BURST_PYTHON_MIRROR``)."""
    shipped = index.get(INTERPRETER_FIELD) or {}
    machine = platform.machine().lower()
    if str(shipped.get("python")) == wanted and shipped.get("machine") in (None, machine):
        return "shipped"
    if _uv_wheel(index) is not None or shutil.which("uv", path=environ.get("PATH", os.defpath)):
        return "uv"
    here = "{}.{}".format(*sys.version_info[:2])
    raise BootstrapError(
        f"the run's environment is Python {wanted} and this node has none (python3 is "
        f"{here}, no python{wanted} on PATH), the store holds no standalone Python {wanted} "
        f"and no uv to install one: run 'uv python install {wanted}' where you resume "
        f"(burst then ships it), or use an image with Python {wanted} (SkyPilot image_id)",
        2)


def _uv_wheel(index: dict):
    return next((w for w in index.get("wheels") or [] if w.get("role") == "tool"
                 and str(w.get("file", "")).lower().startswith("uv-")), None)


def obtain_python(way: str, wanted: str, source, index: dict, dest: str, node: str,
                  environ: dict) -> str:
    """The lock's Python on this node, by ``way`` (see :func:`python_way`)."""
    if way == "shipped":
        return unpack_interpreter(source, index[INTERPRETER_FIELD], node)
    return uv_install(wanted, index, dest, node, environ)


def unpack_interpreter(source, entry: dict, node: str) -> str:
    """Fetch the shipped standalone Python (hash-checked), unpack it under
    ``$BURST_NODE_DIR/python`` (kept for a later setup of the same node) and return it."""
    name = str(entry.get("file", ""))
    if not re.match(r"^[A-Za-z0-9._+-]+\.tar\.gz$", name) or \
            not re.match(r"^[0-9a-f]{64}$", str(entry.get("sha256", ""))):
        raise BootstrapError(f"the wheelhouse index names an odd interpreter {name!r}")
    home = os.path.join(node, "python", entry["sha256"][:16])
    executable = os.path.join(home, "python", clean_key(str(entry.get("executable") or
                                                            f"bin/python{entry['python']}")))
    if os.path.exists(executable) and python_version_of(executable) == str(entry["python"]):
        return executable
    os.makedirs(node, exist_ok=True)
    archive = os.path.join(node, name)
    out = _HashingFile(archive + ".part")
    try:
        try:
            fetch_retrying(source, clean_key(str(entry.get("key", ""))), out)
        except NotFound:
            raise BootstrapError(f"the standalone Python {name} is named in the wheelhouse "
                                 f"index but missing from {source.where}") from None
    finally:
        out.file.close()
    if out.sha.hexdigest() != entry["sha256"]:
        os.unlink(archive + ".part")
        raise BootstrapError(f"the standalone Python {name} does not match its sha256: "
                             "refusing it")
    os.replace(archive + ".part", archive)
    shutil.rmtree(home, ignore_errors=True)
    _extract(archive, home)
    os.unlink(archive)
    if python_version_of(executable) != str(entry["python"]):
        raise BootstrapError(f"the standalone Python {entry.get('version')} from the store "
                             f"does not run on this node ({executable})")
    say(f"Python {entry.get('version')} from the store ({int(entry.get('size') or 0) / 1e6:.0f} "
        f"MB, a standalone build) in {home}")
    return executable


def _extract(archive: str, home: str) -> None:
    """Unpack a tar.gz into ``home``; nothing may land outside it (no absolute or ``..``
    names, no link that points out), whichever Python runs this."""
    import tarfile

    root = os.path.realpath(home)
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            target = os.path.realpath(os.path.join(root, member.name))
            linked = os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))
            if not (target == root or target.startswith(root + os.sep)) or member.isdev() \
                    or (member.issym() and not linked.startswith(root + os.sep)) \
                    or member.islnk():
                raise BootstrapError(f"the standalone Python's archive holds an unsafe entry "
                                     f"{member.name!r}: refusing it")
        if hasattr(tarfile, "data_filter"):  # 3.12+ (and late 3.8-3.11 releases)
            tar.extractall(root, members, filter="fully_trusted")  # checked above
        else:
            tar.extractall(root, members)


def uv_install(wanted: str, index: dict, dest: str, node: str, environ: dict) -> str:
    """Install the lock's Python with uv (the node's, or the one in the wheelhouse) into
    ``$BURST_NODE_DIR/python-uv``, from ``$BURST_PYTHON_MIRROR`` when the task names one."""
    uv = shutil.which("uv", path=environ.get("PATH", os.defpath)) or _unpack_uv(index, dest,
                                                                                node)
    env = dict(environ)
    env["UV_PYTHON_INSTALL_DIR"] = os.path.join(node, "python-uv")
    for ours, theirs in ((PYTHON_MIRROR_ENV, "UV_PYTHON_INSTALL_MIRROR"),
                         (PYTHON_DOWNLOADS_ENV, "UV_PYTHON_DOWNLOADS_JSON_URL")):
        if environ.get(ours):
            env[theirs] = environ[ours]
    mirror = env.get("UV_PYTHON_INSTALL_MIRROR") or "python-build-standalone's releases"
    say(f"installing Python {wanted} with uv from {mirror}")
    done = subprocess.run([uv, "python", "install", "--no-config", wanted], env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BootstrapError(f"uv could not install Python {wanted} from {mirror}: {last}")
    found = _uv_find(uv, wanted, env)
    if not found:
        raise BootstrapError(f"uv installed Python {wanted} but cannot find it")
    return found


def _unpack_uv(index: dict, dest: str, node: str) -> str:
    """The ``uv`` binary out of the wheelhouse's uv wheel (a zip: no pip needed)."""
    import zipfile

    wheel = _uv_wheel(index)
    if wheel is None:
        raise BootstrapError("this node has no uv and the wheelhouse holds none")
    target = os.path.join(node, "tools", "uv")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with zipfile.ZipFile(os.path.join(dest, wheel["file"])) as zipped:
        member = next((n for n in zipped.namelist()
                       if re.match(r"^[^/]+\.data/scripts/uv$", n)), None)
        if member is None:
            raise BootstrapError(f"{wheel['file']} holds no uv binary")
        with zipped.open(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
    os.chmod(target, 0o755)
    return target


def can_ensurepip(python: str, environ: dict) -> bool:
    """Whether ``python -m venv`` can seed pip here (Debian/Ubuntu need python3-venv)."""
    if environ.get(PIP_MODE_ENV) == "wheel":
        return False
    try:
        done = subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


# -- stores -----------------------------------------------------------------------------------


def clean_key(key: str) -> str:
    """A store key: relative, no ``..``, no empty parts (an index cannot point elsewhere)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise BootstrapError(f"the wheelhouse index names an unsafe key {key!r}")
    return key


class FileSource:
    """``file:///path`` or a plain path: the store is a directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.where = root

    def fetch(self, key: str, out, start: int = 0) -> None:
        """Copy the object into ``out`` from byte ``start`` (``out.at`` is told where)."""
        try:
            with open(os.path.join(self.root, *key.split("/")), "rb") as f:
                if start:
                    f.seek(start)
                    out.at(start)
                shutil.copyfileobj(f, out, CHUNK)
        except FileNotFoundError:
            raise NotFound(key) from None


def sigv4_headers(method: str, url: str, region: str, access_key: str, secret_key: str,
                  token: str | None = None, payload_hash: str = EMPTY_SHA256,
                  now: datetime.datetime | None = None, service: str = "s3",
                  headers: dict | None = None) -> dict:
    """The headers (``Authorization`` and the ``x-amz-*`` it signs) of an AWS Signature
    Version 4 request. ``url``'s path must already be URI-encoded, as S3 wants it (S3 is
    the one service whose canonical path is not normalized or encoded a second time)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    parts = urllib.parse.urlsplit(url)
    signed = {k.lower(): str(v).strip() for k, v in (headers or {}).items()}
    signed["host"] = parts.netloc
    signed["x-amz-content-sha256"] = payload_hash
    signed["x-amz-date"] = amz_date
    if token:
        signed["x-amz-security-token"] = token
    names = sorted(signed)
    query = sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    canonical_query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}="
                               f"{urllib.parse.quote(v, safe='-_.~')}" for k, v in query)
    canonical = "\n".join([method, parts.path or "/", canonical_query,
                           "".join(f"{n}:{' '.join(signed[n].split())}\n" for n in names),
                           ";".join(names), payload_hash])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {n: signed[n] for n in names if n != "host"}
    out["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return out


class S3Source:
    """Signed GETs against S3 or an S3-compatible endpoint (OSS, MinIO, SeaweedFS, R2...)."""

    def __init__(self, bucket: str, prefix: str, endpoint: str, region: str,
                 style: str, credentials: tuple | None, ca_bundle: str | None = None) -> None:
        self.bucket, self.prefix, self.region = bucket, prefix.strip("/"), region
        self.endpoint = endpoint.rstrip("/")
        self.style = style
        self.credentials = credentials  # (key, secret, token) or None: unsigned
        self.context = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else None
        self.where = f"{bucket}/{self.prefix} at {self.endpoint}"
        self.regional = False  # True: the endpoint is AWS's for self.region (it moves with it)
        self.moved = False  # the region was corrected once, from an answer that named it

    def url(self, key: str) -> str:
        full = f"{self.prefix}/{key}" if self.prefix else key
        path = urllib.parse.quote(full, safe="/-_.~")
        parts = urllib.parse.urlsplit(self.endpoint)
        if self.style == "virtual":
            return f"{parts.scheme}://{self.bucket}.{parts.netloc}{parts.path}/{path}"
        if self.style == "bucket":  # a domain bound to the bucket (an OSS custom domain)
            return f"{self.endpoint}/{path}"
        return f"{self.endpoint}/{urllib.parse.quote(self.bucket, safe='-_.~')}/{path}"

    def fetch(self, key: str, out, start: int = 0) -> None:
        """GET the object into ``out``; from byte ``start`` a ``Range: bytes=start-`` GET
        (signed like any header), and ``out.at`` is told where the body begins: ``start``
        (206), or 0 when the server sent the whole object (200)."""
        url, signed_for = self.url(key), self.region
        headers = {"Range": f"bytes={start}-"} if start else {}
        if self.credentials:
            access, secret, token = self.credentials
            headers.update(sigv4_headers("GET", url, self.region, access, secret, token,
                                         headers=headers))
        request = urllib.request.Request(url, headers=headers, method="GET")
        try:
            with urllib.request.urlopen(request, timeout=60, context=self.context) as response:
                if start:
                    out.at(start if response.status == 206 and _range_starts(
                        response.headers.get("Content-Range"), start) else 0)
                shutil.copyfileobj(response, out, CHUNK)
                if response.length:  # http.client ends a body cut short without a word
                    raise http.client.IncompleteRead(b"", response.length)
        except urllib.error.HTTPError as error:
            body = error.read(4096).decode("utf-8", "replace")
            if self.move_to(region_named(error.code, error.headers, body), signed_for):
                self.fetch(key, out, start)
                return
            if error.code == 416 and start:  # nothing past ``start``: fetch it whole again
                out.at(0)
                self.fetch(key, out)
                return
            code = re.search(r"<Code>([^<]+)</Code>", body)
            what = code.group(1) if code else error.reason
            if error.code == 404 or what in ("NoSuchKey", "NoSuchBucket"):
                raise NotFound(key) from None
            hint = ": check the store's credentials (task secrets)" if error.code == 403 else ""
            raise BootstrapError(f"{self.where} answered {error.code} {what} for {key}{hint}"
                                 ) from None

    def move_to(self, region: str | None, signed_for: str) -> bool:
        """Sign for ``region`` from now on: the bucket lives there (an answer to a request
        signed for ``signed_for`` named it), as boto3 does on the laptop. Once per source
        (a second region named is an error, not a move); False: nothing to retry."""
        if not region or region == signed_for or (self.moved and region != self.region):
            return False
        if self.moved:  # another request moved it already
            return True
        say(f"the bucket {self.bucket} is in {region}, not {self.region}: signing for {region}")
        self.region, self.moved = region, True
        if self.regional:
            self.endpoint = f"https://s3.{region}.amazonaws.com"
            self.where = f"{self.bucket}/{self.prefix} at {self.endpoint}"
        return True


def region_named(status: int, headers, body: str) -> str | None:
    """The bucket's region an S3 error names: 400 ``AuthorizationHeaderMalformed`` (the
    request was signed for another region) or 301 ``PermanentRedirect``, in the
    ``x-amz-bucket-region`` header or the body's ``<Region>``; None for any other error."""
    if status not in (301, 400):
        return None
    code = re.search(r"<Code>([^<]+)</Code>", body)
    if status == 400 and (code is None or code.group(1) != "AuthorizationHeaderMalformed"):
        return None
    named = (headers.get("x-amz-bucket-region") if headers is not None else None) or ""
    found = re.search(r"<Region>([a-z0-9-]+)</Region>", body)
    named = named.strip() or (found.group(1) if found else "")
    return named if re.match(r"^[a-z]{2}(-[a-z0-9]+)+$", named) else None


def _range_starts(content_range, start: int) -> bool:
    """Whether a 206's ``Content-Range`` (``bytes 100-199/200``) begins at ``start``."""
    return str(content_range or "").startswith(f"bytes {start}-")


def _dns_bucket(bucket: str) -> bool:
    return bool(re.match(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$", bucket))


def _is_ip_or_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def s3_source(url: str, environ: dict) -> S3Source:
    """An :class:`S3Source` for ``s3://`` or ``oss://`` with the task's settings."""
    parts = urllib.parse.urlsplit(url)
    scheme, bucket, prefix = parts.scheme.lower(), parts.netloc, parts.path
    if not bucket:
        raise BootstrapError(f"{url!r} names no bucket", 2)
    endpoint = first(environ, "BURST_ENDPOINT_URL", "BURST_S3_ENDPOINT_URL",
                     "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    region = first(environ, "BURST_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
    style = (environ.get("BURST_ADDRESSING_STYLE") or "auto").lower()
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    if scheme == "oss":
        region = region or environ.get("OSS_REGION") or ""
        match = re.match(r"^(oss-)?([a-z]{2}-[a-z0-9-]+)$", region.strip().lower())
        if not match and not endpoint:
            raise BootstrapError(f"{url}: OSS needs a region such as oss-cn-beijing "
                                 "($BURST_REGION)", 2)
        if match:
            region = match.group(2)
            internal = (environ.get("BURST_OSS_INTERNAL") or "").lower() in ("1", "true", "yes")
            endpoint = endpoint or (f"https://s3.oss-{region}"
                                    f"{'-internal' if internal else ''}.aliyuncs.com")
        style = "virtual"
        if environ.get("OSS_ACCESS_KEY_ID") and environ.get("OSS_ACCESS_KEY_SECRET"):
            keys = ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN")
    region = region or "us-east-1"
    regional = not endpoint
    if not endpoint:
        endpoint = f"https://s3.{region}.amazonaws.com"
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    if style not in ("path", "virtual"):
        style = "virtual" if _dns_bucket(bucket) and not _is_ip_or_local(host) else "path"
    if (environ.get("BURST_BUCKET_ENDPOINT") or "").lower() in ("1", "true", "yes", "on"):
        style = "bucket"
    access, secret = environ.get(keys[0]), environ.get(keys[1])
    credentials = (access, secret, environ.get(keys[2]) or None) if access and secret else None
    if credentials is None and (environ.get(IDENTITY_ENV) or "").strip().lower() == "own":
        credentials = own_credentials(scheme, environ)
    source = S3Source(bucket, prefix, endpoint, region, style, credentials,
                      first(environ, "BURST_CA_BUNDLE", "AWS_CA_BUNDLE") or None)
    source.regional = regional
    return source


# -- the node's own identity ------------------------------------------------------------------
# node_identity = "own": the task carries no keys; the node's role hands out short-lived
# ones. boto3 (burst node setup, the run) reads AWS's instance metadata and web-identity
# token itself, and burst.store.ramrole reads Alibaba's; this file has only urllib.


def own_credentials(scheme: str, environ: dict) -> tuple:
    """(key, secret, token) of the node's own role: a web-identity token file (EKS, an
    OIDC-federated pod) through STS, else the instance role from the metadata service
    (Alibaba ECS for oss://, AWS IMDSv2 otherwise). One line when there is none."""
    if scheme == "oss":
        return metadata_role(ALIBABA_ROLE, environ)
    if environ.get("AWS_WEB_IDENTITY_TOKEN_FILE") and environ.get("AWS_ROLE_ARN"):
        return web_identity(environ)
    return metadata_role(AWS_ROLE, environ)


# (name, metadata base URL, token PUT header, token header, role listing, key fields)
AWS_ROLE = ("AWS instance metadata", "http://169.254.169.254",
            "X-aws-ec2-metadata-token-ttl-seconds", "X-aws-ec2-metadata-token",
            "/latest/meta-data/iam/security-credentials/",
            ("AccessKeyId", "SecretAccessKey", "Token"))
ALIBABA_ROLE = ("Alibaba ECS metadata", "http://100.100.100.200",
                "X-aliyun-ecs-metadata-token-ttl-seconds", "X-aliyun-ecs-metadata-token",
                "/latest/meta-data/ram/security-credentials/",
                ("AccessKeyId", "AccessKeySecret", "SecurityToken"))
IDENTITY_ENV = "BURST_NODE_IDENTITY"  # burst.store.settings.OPTIONS["node_identity"]
METADATA_URL_ENV = "BURST_METADATA_URL"  # burst.contract.ENV_METADATA_URL
ALIBABA_ROLE_ENV = "ALIBABA_CLOUD_ECS_METADATA"  # the role's name, as Alibaba's SDKs read it
STS_ENDPOINT_ENV = "AWS_ENDPOINT_URL_STS"  # as boto3 reads it


def _metadata(method: str, url: str, headers: dict, timeout: float = 2.0) -> str:
    """One metadata request, never through a proxy (the service is link-local)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=headers, method=method)
    with opener.open(request, timeout=timeout) as response:
        return response.read(65536).decode("utf-8", "replace")


def metadata_role(cloud: tuple, environ: dict) -> tuple:
    """The instance role's credentials from the metadata service, hardened mode first
    (a session token from ``PUT /latest/api/token``: IMDSv2, ECS's hardened mode); a
    service that refuses the PUT is asked without one."""
    name, default, ttl_header, token_header, listing, fields = cloud
    base = (environ.get(METADATA_URL_ENV) or default).rstrip("/")
    headers = {}
    try:
        token = _session_token(f"{base}/latest/api/token", ttl_header)
        if token:
            headers[token_header] = token
        role = (environ.get(ALIBABA_ROLE_ENV) if cloud is ALIBABA_ROLE else "") or \
            _metadata("GET", base + listing, headers).split()[0]
        answer = json.loads(_metadata("GET", base + listing + urllib.parse.quote(role), headers))
    except urllib.error.HTTPError as error:
        raise BootstrapError(f"node_identity is \"own\" but {name} ({base}) gives this node "
                             f"no role credentials ({error.code}): attach a role to the "
                             "instance, or forward keys (node_identity = \"forward\")", 2
                             ) from None
    except (OSError, ValueError, IndexError) as error:
        reason = getattr(error, "reason", None) or error or "no role"
        raise BootstrapError(f"node_identity is \"own\" but {name} ({base}) did not answer "
                             f"with role credentials ({reason}): is this node on that cloud, "
                             "with a role attached?", 2) from None
    return _role_keys(answer, fields, name)


def _session_token(url: str, ttl_header: str) -> str:
    """The hardened mode's session token; empty where the service has no such mode, or
    where the PUT gets no answer (IMDSv2's hop limit of 1 drops it inside a container,
    where the plain GET may still be allowed, as boto3 also tries)."""
    try:
        return _metadata("PUT", url, {ttl_header: "21600"}).strip()
    except OSError:
        return ""


def _role_keys(answer, fields: tuple, name: str) -> tuple:
    keys = tuple(str(answer.get(f) or "") if isinstance(answer, dict) else "" for f in fields)
    if not all(keys):
        raise BootstrapError(f"{name}'s role credentials lack {', '.join(fields)}", 2)
    say(f"signing with the node's own role credentials ({name}, key {keys[0][:4]}...)")
    return keys


def web_identity(environ: dict) -> tuple:
    """STS ``AssumeRoleWithWebIdentity`` with the token file's token: an unsigned call
    (the token is the proof), the same one boto3 makes on the node later."""
    region = first(environ, "AWS_REGION", "AWS_DEFAULT_REGION")
    endpoint = environ.get(STS_ENDPOINT_ENV) or (
        f"https://sts.{region}.amazonaws.com" if region else "https://sts.amazonaws.com")
    try:
        with open(environ["AWS_WEB_IDENTITY_TOKEN_FILE"], encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as error:
        raise BootstrapError(f"cannot read the web identity token "
                             f"{environ['AWS_WEB_IDENTITY_TOKEN_FILE']}: {error}", 2) from None
    query = urllib.parse.urlencode({
        "Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15",
        "RoleArn": environ["AWS_ROLE_ARN"], "WebIdentityToken": token,
        "RoleSessionName": environ.get("AWS_ROLE_SESSION_NAME") or "burst-node"})
    request = urllib.request.Request(endpoint.rstrip("/") + "/", data=query.encode(),
                                     method="POST")  # answered in XML
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        found = re.search(r"<Message>([^<]+)</Message>", error.read(4096).decode("utf-8",
                                                                                 "replace"))
        raise BootstrapError(f"STS at {endpoint} refused the web identity token for "
                             f"{environ['AWS_ROLE_ARN']} ({error.code}"
                             f"{': ' + found.group(1) if found else ''})", 2) from None
    except OSError as error:
        raise BootstrapError(f"STS at {endpoint} did not answer: "
                             f"{getattr(error, 'reason', None) or error}") from None
    values = {k: re.search(f"<{k}>([^<]+)</{k}>", text) for k in
              ("AccessKeyId", "SecretAccessKey", "SessionToken")}
    answer = {k: v.group(1) for k, v in values.items() if v}
    return _role_keys(answer, ("AccessKeyId", "SecretAccessKey", "SessionToken"), "STS")


class SFTPSource:
    """``sftp://[user@]host[:port]/dir`` through the system's OpenSSH client."""

    def __init__(self, url: str, environ: dict) -> None:
        parts = urllib.parse.urlsplit(url)
        if not parts.hostname or not parts.path.strip("/"):
            raise BootstrapError(f"{url!r}: use sftp://[user@]host[:port]/path", 2)
        self.host = parts.hostname
        self.user = urllib.parse.unquote(parts.username or "")
        self.port = parts.port
        self.root = urllib.parse.unquote(parts.path).rstrip("/")
        self.where = url
        self.options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
        if environ.get("BURST_SSH_CONFIG"):
            self.options += ["-F", os.path.expanduser(environ["BURST_SSH_CONFIG"])]
        if environ.get("BURST_KNOWN_HOSTS"):
            self.options += ["-o", "UserKnownHostsFile="
                             + os.path.expanduser(environ["BURST_KNOWN_HOSTS"])]
        if environ.get("BURST_SSH_IDENTITY"):
            self.options += ["-i", os.path.expanduser(environ["BURST_SSH_IDENTITY"])]
        if self.port:
            self.options += ["-P", str(self.port)]
        self.sftp, self.scp = shutil.which("sftp"), shutil.which("scp")
        if not (self.sftp or self.scp):
            raise BootstrapError("sftp:// stores need OpenSSH's sftp or scp on the node "
                                 "(apt-get install openssh-client)", 2)

    def fetch(self, key: str, out, start: int = 0) -> None:
        """``sftp``'s ``get`` (``reget`` from byte ``start``) straight into a part file
        (``out.path``), so a cut transfer leaves what arrived there; else through a
        temporary file (``scp``: no resume, ``out.at(0)``)."""
        remote = f"{self.root}/{key}"
        target = f"{self.user}@{self.host}" if self.user else self.host
        if self.sftp and hasattr(out, "path"):
            out.flush()
            try:
                self._sftp(key, target, f'{"reget" if start else "get"} "{remote}" '
                                        f'"{out.path}"\n')
            finally:
                out.catch_up()  # what sftp wrote, counted and hashed
            return
        if start:
            out.at(0)
        with tempfile.TemporaryDirectory(prefix="burst-sftp-") as tmp:
            local = os.path.join(tmp, "object")
            if self.sftp:
                batch = f'get "{remote}" "{local}"\n'
                done = subprocess.run([self.sftp, "-q", "-b", "-", *self.options, target],
                                      input=batch, capture_output=True, text=True, check=False)
            else:
                assert self.scp is not None  # the constructor found sftp or scp
                done = subprocess.run([self.scp, "-q", *self.options, f"{target}:{remote}",
                                       local], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                if "not found" in error.lower() or "no such file" in error.lower():
                    raise NotFound(key)
                raise BootstrapError(f"{self.where}: cannot fetch {key}: {error}")
            with open(local, "rb") as f:
                shutil.copyfileobj(f, out, CHUNK)

    def _sftp(self, key: str, target: str, batch: str) -> None:
        assert self.sftp is not None  # called only where the constructor found sftp
        done = subprocess.run([self.sftp, "-q", "-b", "-", *self.options, target],
                              input=batch, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            if "not found" in error.lower() or "no such file" in error.lower():
                raise NotFound(key)
            raise ConnectionError(f"{self.where}: cannot fetch {key}: {error}")


def open_source(url: str, environ: dict):
    """The store the task names, for reading."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("", "file"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path) if scheme else url
        return FileSource(os.path.expanduser(path))
    if scheme in ("s3", "oss"):
        return s3_source(url, environ)
    if scheme == "sftp":
        return SFTPSource(url, environ)
    raise BootstrapError(f"the bootstrap cannot read {scheme}:// stores: it reads file://, "
                         "s3:// (and S3-compatible endpoints), oss:// and sftp://", 2)


def first(environ: dict, *names: str) -> str | None:
    return next((environ[n] for n in names if environ.get(n)), None)


def prefer_internal(environ: dict) -> None:
    """``$BURST_OSS_INTERNAL=auto`` (what a resumed node is given for an OSS store): use
    the region's internal endpoint when this node reaches it (inside the region's VPC: no
    NAT gateway needed, no traffic billed), else the public one; decided once, here, in
    ``environ``, before the store is opened."""
    if (environ.get("BURST_OSS_INTERNAL") or "").strip().lower() != "auto":
        return
    environ["BURST_OSS_INTERNAL"] = "false"
    internal = environ.get("BURST_OSS_INTERNAL_ENDPOINT") or ""
    region = (environ.get("BURST_REGION") or environ.get("OSS_REGION") or "").strip().lower()
    match = re.match(r"^(oss-)?([a-z]{2}-[a-z0-9-]+)$", region)
    if not internal and match and not environ.get("BURST_ENDPOINT_URL"):
        internal = f"https://s3.oss-{match.group(2)}-internal.aliyuncs.com"
    parts = urllib.parse.urlsplit(internal)
    if not parts.hostname:
        return
    import socket

    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=2):
            pass
    except OSError:
        say(f"the internal endpoint {internal} is not reachable from here: using the public one")
        return
    environ["BURST_ENDPOINT_URL"] = internal
    say(f"reading the store through its internal endpoint {internal}")


# -- the wheelhouse ---------------------------------------------------------------------------


def index_key(run_id: str, digest: str) -> str:
    return f"{run_id}/env/wheelhouse-{digest}.json"


def load_index(source, run_id: str, digest: str) -> dict:
    """The run's wheelhouse index for this lockfile, checked for shape."""
    buffer = _Buffer()
    try:
        fetch_retrying(source, index_key(run_id, digest), buffer)
    except NotFound:
        raise BootstrapError(f"the store {source.where} has no wheelhouse for lockfile "
                             f"{digest[:12]} of run {run_id}: burst resume builds it (or "
                             "burst push on the machine that ran it)") from None
    try:
        index = json.loads(buffer.getvalue())
    except ValueError:
        raise BootstrapError(f"the wheelhouse index of lockfile {digest[:12]} is not JSON"
                             ) from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise BootstrapError(f"the wheelhouse index of lockfile {digest[:12]} has format "
                             f"{index.get('format') if isinstance(index, dict) else '?'!r}; "
                             f"this bootstrap reads format {INDEX_FORMAT}")
    return index


def check_target(index: dict, wanted: str) -> None:
    target = index.get("target") or {}
    machine = (target.get("machine") or "").lower()
    here = platform.machine().lower()
    if machine and here and machine != here:
        raise BootstrapError(f"the wheelhouse was built for {machine} and this node is {here}",
                             2)
    python = str(target.get("python") or "")
    if wanted and python and python != wanted:
        raise BootstrapError(f"the wheelhouse was built for Python {python}, the lockfile "
                             f"says {wanted}", 2)


class _Buffer:
    def __init__(self) -> None:
        self.parts: list = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)

    def reset(self) -> None:
        self.parts = []


def fetch_retrying(source, key: str, out) -> None:
    """``source.fetch`` with a few attempts on network errors (not on a missing key)."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            source.fetch(key, out)
            return
        except CUT as error:
            if attempt == ATTEMPTS:
                reason = getattr(error, "reason", None) or error
                raise BootstrapError(f"cannot read {key} from {source.where}: {reason}"
                                     ) from None
            out.reset()


class _HashingFile:
    """A file being written that hashes what goes into it."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 (closed by download, after retries)
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.file.write(data)

    def reset(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.sha = hashlib.sha256()


def sha256_of(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            sha.update(block)
    return sha.hexdigest()


def checked_entries(index: dict) -> list:
    """The index's wheels, each with a plain file name and a safe key."""
    wheels = index.get("wheels")
    if not isinstance(wheels, list):
        raise BootstrapError("the wheelhouse index lists no wheels")
    for wheel in wheels:
        name = str(wheel.get("file", ""))
        if not name.endswith(".whl") or "/" in name or name.startswith("."):
            raise BootstrapError(f"the wheelhouse index names an odd wheel file {name!r}")
        if not re.match(r"^[0-9a-f]{64}$", str(wheel.get("sha256", ""))):
            raise BootstrapError(f"the wheelhouse index gives {name} no sha256")
        clean_key(str(wheel.get("key", "")))
    return wheels


class _PartFile:
    """``<file>.part``: a download in progress, appended to and hashed as it grows.

    Opened on what an earlier try left (a cut connection, a killed node setup: the task
    runs setup again, and a managed job's recovery on a node that kept its disk), it
    hashes those bytes first and the download continues from its size, so the hash is
    still over the whole file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = open(path, "ab")  # noqa: SIM115 (closed by fetch_file)
        self.sha = hashlib.sha256()
        self.size = 0
        self.catch_up()

    def write(self, data: bytes) -> int:
        self.file.write(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.file.flush()

    def catch_up(self) -> None:
        """Hash what lies on disk past what was hashed (written by another program)."""
        self.file.flush()
        with open(self.path, "rb") as f:
            f.seek(self.size)
            for block in iter(lambda: f.read(CHUNK), b""):
                self.sha.update(block)
                self.size += len(block)

    def at(self, offset: int) -> None:
        """The source's bytes begin at ``offset``: here (a resumed GET) or 0 (it sends the
        whole object: start again)."""
        if offset != self.size:
            self.restart()

    def restart(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.sha, self.size = hashlib.sha256(), 0


def fetch_resuming(source, key: str, out: _PartFile, size=None) -> None:
    """``source.fetch`` into ``out`` from its size, again from where it stopped each time
    the transfer breaks off (or a body ends short of ``size``); gives up after
    :data:`ATTEMPTS` tries in a row that brought no new byte (a missing key or a refusal
    is not retried here)."""
    idle = 0
    while size is None or out.size < size:
        before = out.size
        try:
            source.fetch(key, out, out.size)
            if size is None or out.size >= size:
                return
            error: Exception = ConnectionError(f"the body ended at byte {out.size} of {size}")
        except CUT as cut:
            error = cut
        out.flush()
        idle = 0 if out.size > before else idle + 1
        reason = " ".join(str(getattr(error, "reason", None) or error).split())[:160]
        if idle >= ATTEMPTS:
            raise BootstrapError(f"cannot read {key} from {source.where}: {reason}")
        say(f"reading {key.rsplit('/', 1)[-1]} broke off at byte {out.size} ({reason}); "
            "continuing from there")
        time.sleep(0.5 * idle)


def fetch_file(source, key: str, path: str, sha256: str, size=None) -> int:
    """Download ``key`` into ``path`` (through ``path.part``, continued from its size
    and renamed in once the whole file matches ``sha256``); returns the bytes fetched.

    A part file that does not end as the object (left by an older object of the same
    name) is fetched again once from byte 0. Raises :class:`Mismatch` when even that does
    not match."""
    partial = path + ".part"
    if size is not None and os.path.exists(partial) and os.path.getsize(partial) > size:
        os.unlink(partial)
    out = _PartFile(partial)
    resumed = out.size
    try:
        if resumed:
            say(f"continuing {os.path.basename(path)} from byte {resumed}")
        fetch_resuming(source, key, out, size)
        if resumed and out.sha.hexdigest() != sha256:
            out.restart()
            fetch_resuming(source, key, out, size)
            resumed = 0
    finally:
        out.file.close()
    got = out.sha.hexdigest()
    if got != sha256:
        os.unlink(partial)
        raise Mismatch(got)
    os.replace(partial, path)
    return out.size - resumed


class Mismatch(Exception):
    """A downloaded file's SHA-256 (the argument) is not the one expected."""


def fetch_wheel(source, wheel: dict, dest: str) -> int:
    """One wheel into ``dest``, hash-checked; returns the bytes fetched."""
    size = wheel.get("size")
    try:
        return fetch_file(source, wheel["key"], os.path.join(dest, wheel["file"]),
                          wheel["sha256"], size if isinstance(size, int) else None)
    except NotFound:
        raise BootstrapError(f"wheel {wheel['file']} is listed in the wheelhouse "
                             f"index but missing from {source.where}") from None
    except Mismatch as error:
        raise BootstrapError(f"wheel {wheel['file']} does not match its sha256 (expected "
                             f"{wheel['sha256'][:12]}..., got {str(error)[:12]}...): "
                             "refusing it") from None


def download(source, wheels: list, dest: str) -> tuple:
    """Every wheel into ``dest``, :data:`WHEEL_WORKERS` at a time, each checked against
    its SHA-256 and continued from what an earlier try left; (fetched bytes, kept)."""
    os.makedirs(dest, exist_ok=True)
    todo = [w for w in wheels if not (os.path.exists(os.path.join(dest, w["file"])) and
                                      sha256_of(os.path.join(dest, w["file"])) == w["sha256"])]
    if not todo:
        return 0, len(wheels)
    with ThreadPoolExecutor(min(WHEEL_WORKERS, len(todo))) as pool:
        futures = [pool.submit(fetch_wheel, source, w, dest) for w in todo]
        fetched = 0
        try:
            for future in futures:
                fetched += future.result()
        except BaseException:
            for future in futures:  # fail fast: the wheels not started are not fetched
                future.cancel()
            raise
    return fetched, len(wheels) - len(todo)


# -- the venv and the install -----------------------------------------------------------------


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def make_venv(python: str, venv: str, wanted: str, with_pip: bool) -> bool:
    """The node's venv (kept when it is already there with the right Python); returns
    whether it has pip of its own."""
    existing = venv_python(venv)
    if os.path.exists(existing) and python_version_of(existing) == (
            wanted or python_version_of(python)):
        return _has_pip(existing)
    if os.path.exists(venv):
        shutil.rmtree(venv)
    if with_pip:
        done = subprocess.run([python, "-m", "venv", venv], capture_output=True, text=True,
                              check=False)
        if done.returncode == 0:
            return True
        shutil.rmtree(venv, ignore_errors=True)
    done = subprocess.run([python, "-m", "venv", "--without-pip", venv], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BootstrapError(f"cannot create a venv with {python}: {last}")
    return False


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-c", "import pip"], capture_output=True,
                          check=False).returncode == 0


def mirror_args(environ: dict, index: dict) -> list:
    """pip's index options for the forwarded mirrors (empty: there are none)."""
    args = []
    if environ.get("BURST_INDEX_URL"):
        args += ["--index-url", environ["BURST_INDEX_URL"]]
    for url in (environ.get("BURST_EXTRA_INDEX_URL") or "").split():
        args += ["--extra-index-url", url]
    torch = environ.get("BURST_TORCH_INDEX") or ""
    variant = (index.get("target") or {}).get("torch_variant")
    if torch and variant and "{variant}" in torch:
        args += ["--extra-index-url", torch.replace("{variant}", str(variant))]
    return args


def install(venv: str, has_pip: bool, wheels: list, dest: str, environ: dict,
            index: dict) -> str:
    """Install burst's wheel (and through it its dependencies) from ``dest``; returns what
    was installed, for the log."""
    python = venv_python(venv)
    burst = [w for w in wheels if w.get("role") == "burst"]
    spec = environ.get("BURST_SPEC") or ""
    targets = [os.path.join(dest, w["file"]) for w in burst] or ([spec] if spec else [])
    if not targets:
        raise BootstrapError("the wheelhouse holds no burst wheel (role \"burst\") and no "
                             "$BURST_SPEC names one to fetch from a mirror")
    pip = [python, "-m", "pip"]
    if not has_pip:
        tool = [w for w in wheels if w.get("role") == "tool"
                and w["file"].lower().startswith("pip-")]
        if not tool:
            raise BootstrapError("this node's Python has no ensurepip (python3-venv) and the "
                                 "wheelhouse holds no pip wheel to run instead")
        pip = [python, os.path.join(dest, tool[0]["file"], "pip")]
        targets.append("pip")  # the venv keeps a pip of its own for burst node setup
    # --no-compile: byte-compiling every module of torch and the rest takes longer than
    # the install itself on a small node; Python compiles what the run imports, once
    base = [*pip, "install", "--disable-pip-version-check", "--no-input", "--quiet",
            "--no-compile", "--find-links", dest]
    env = dict(environ)
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    done = subprocess.run([*base, "--no-index", *targets], env=env, check=False)
    if done.returncode != 0:
        mirrors = mirror_args(environ, index)
        if not mirrors:
            raise BootstrapError(f"pip could not install burst from the wheelhouse alone (exit "
                                 f"{done.returncode}, see above) and no package mirror is "
                                 "forwarded ($BURST_INDEX_URL)")
        say("the wheelhouse alone was not enough: trying the forwarded package mirrors")
        done = subprocess.run([*base, *mirrors, *targets], env=env, check=False)
        if done.returncode != 0:
            raise BootstrapError(f"pip could not install burst (exit {done.returncode}), "
                                 "see above")
    if not os.path.exists(os.path.join(venv, "bin", "burst")):
        raise BootstrapError(f"burst installed but {venv}/bin/burst is missing")
    return ", ".join(f"{w.get('name')} {w.get('version')}" for w in burst) or spec


# -- the whole --------------------------------------------------------------------------------


def run(environ: dict) -> None:
    check_running_python()
    run_id, url = environ.get("BURST_RUN_ID"), environ.get("BURST_STORE")
    digest = environ.get("BURST_LOCKFILE_DIGEST") or ""
    if not run_id or not url:
        raise BootstrapError("the task sets no $BURST_RUN_ID or $BURST_STORE", 2)
    if not re.match(r"^[0-9a-f]{64}$", digest):
        raise BootstrapError("the task names no lockfile ($BURST_LOCKFILE_DIGEST): the run "
                             "was never frozen, so the node cannot rebuild it", 2)
    wanted = (environ.get("BURST_PYTHON") or "").strip()
    python = find_python(wanted, environ)
    if python is None and not wanted:
        raise BootstrapError(f"python3 here is {sys.version_info[0]}.{sys.version_info[1]} "
                             "and the task names no Python ($BURST_PYTHON)", 2)
    prefer_internal(environ)
    source = open_source(url, environ)
    index = load_index(source, run_id, digest)
    check_target(index, wanted)
    wheels = checked_entries(index)
    way = python_way(wanted, index, environ) if python is None else None
    for gap in index.get("missing") or []:
        say(f"not in the wheelhouse: {gap.get('name')} {gap.get('version')} "
            f"({gap.get('why')})")
    node = environ.get("BURST_NODE_DIR") or os.path.join(os.path.expanduser("~"), "burst-node")
    dest, venv = os.path.join(node, "wheelhouse"), os.path.join(node, "venv")
    fetched, kept = download(source, wheels, dest)
    with open(os.path.join(dest, INDEX_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, sort_keys=True, indent=1) + "\n")
    say(f"{len(wheels)} wheels in {dest} ({fetched / 1e6:.1f} MB fetched, {kept} already "
        "there), each matching its sha256")
    if python is None:
        python = obtain_python(str(way), wanted, source, index, dest, node, environ)
    has_pip = make_venv(python, venv, wanted, can_ensurepip(python, environ))
    what = install(venv, has_pip, wheels, dest, environ, index)
    say(f"{what} installed in {venv} (Python {wanted or python_version_of(python)})")


def main() -> int:
    try:
        run(dict(os.environ))
    except BootstrapError as error:
        say(str(error))
        return error.code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Watch a spot node's preemption notice, so the run saves itself before SIGTERM comes.

Clouds warn a spot VM before they take it back: AWS two minutes ahead (IMDSv2
``spot/instance-action``), GCP and Azure about thirty seconds (the metadata server's
``instance/preempted``; a ``Preempt`` scheduled event), Alibaba Cloud five minutes ahead
(ECS metadata ``instance/spot/termination-time`` on ``100.100.100.200``, with the hardened
mode's token when the instance asks for one): the Beijing case, where own capacity runs on
ACK nodes that are preemptible ECS instances. SIGTERM arrives late in that
window, or not at all, and a large snapshot may not finish uploading in what is left. So
on a cloud node a daemon thread polls the notice, and when it appears records a
``preemption-notice`` event and asks the run for a snapshot at its next step boundary,
flushed to the store there (``Run.request_snapshot``). The thread never touches training
state: it only sets a flag the run reads between steps, as the SIGTERM handler does.

The watcher also knows whether the node is spot, and then shortens the run's persist
interval so that a preemption whose notice is missed still loses at most
``max_lost_seconds`` of work (:meth:`Watcher.persist_seconds`).

A Kubernetes pod gets no notice but SIGTERM, and then ``terminationGracePeriodSeconds``
(30 by default; ``$BURST_TERMINATION_GRACE`` says another) before SIGKILL: when no metadata
server answers in a pod, that grace is the bound the persist interval keeps lost work
under (the ``kubernetes`` provider: nothing to poll, the run's SIGTERM handler saves).

Which cloud: ``$BURST_PREEMPTION`` (``aws``, ``gcp``, ``azure``, ``alibaba``, ``kubernetes``,
``probe``, ``off``), else the cloud SkyPilot names in ``$SKYPILOT_CLUSTER_INFO``
(Kubernetes is probed: a GKE node answers for GCP, an ACK node for Alibaba). Anything else,
a laptop or a lab box, starts no thread and sends no packet. ``$BURST_METADATA_URL`` points the watcher at another metadata server (tests use
a fake on loopback). Connections time out in half a second and the first failure ends the
watch quietly, so a machine without a metadata service is never slowed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from burst.contract import ENV_METADATA_URL, Reason

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

ENV_PROVIDER = "BURST_PREEMPTION"  # aws | gcp | azure | alibaba | kubernetes | probe | off
ENV_GRACE = "BURST_TERMINATION_GRACE"  # a pod's terminationGracePeriodSeconds
POD_ENV = "KUBERNETES_SERVICE_HOST"  # set in every Kubernetes pod
ENV_POLL = "BURST_METADATA_POLL"  # seconds between polls (AWS, Azure)
ENV_SPOT = "BURST_SPOT"  # 1 / 0: whether this node is spot, when the metadata cannot say
ENV_MAX_LOST = "BURST_MAX_LOST_SECONDS"
CLUSTER_INFO_ENV = "SKYPILOT_CLUSTER_INFO"

DEFAULT_BASE = "http://169.254.169.254"  # the link-local metadata address of all three
ALIBABA_BASE = "http://100.100.100.200"  # ECS's metadata service
DEFAULT_GRACE = 30.0  # Kubernetes' terminationGracePeriodSeconds unless the pod says more
EVENT = "preemption-notice"
CONNECT_TIMEOUT = 0.5
READ_TIMEOUT = 10.0
DEFAULT_POLL = 2.0
GCP_WAIT = 60  # seconds one GCP long poll may wait for the value to change
MAX_FAILURES = 10  # consecutive failed polls after a first answer before giving up
MIN_PERSIST_SECONDS = 5.0


class Target(Protocol):
    """What the watcher asks of a run (``burst.Run`` provides it)."""

    def record_event(self, name: str, /, **fields: Any) -> None: ...

    def request_snapshot(self, reason: str) -> None: ...


class Unreachable(Exception):
    """The metadata server did not answer (no connection, a timeout, a broken reply)."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()


class Metadata:
    """A tiny HTTP client for the metadata server: stdlib only, no proxies (a metadata
    server is always direct), a short connect timeout and a longer read timeout."""

    def __init__(self, base_url: str, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"${ENV_METADATA_URL} must be an http:// URL, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout

    def request(self, method: str, path: str, headers: Mapping[str, str] | None = None,
                read_timeout: float = READ_TIMEOUT) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            conn.request(method, self.prefix + path, headers=dict(headers or {}))
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                         response.read())
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"{method} {path}: {exc}") from None
        finally:
            conn.close()


class Provider:
    """One cloud's notice: how to recognise its metadata server, whether the node is spot,
    and one poll for the notice (a dict describing it, or None when there is none yet)."""

    name = ""
    notice_seconds = 30.0  # how long the cloud waits between its notice and the end
    base = DEFAULT_BASE  # where its metadata server answers

    def identify(self, client: Metadata) -> bool:
        raise NotImplementedError

    def is_spot(self, client: Metadata) -> bool | None:
        raise NotImplementedError

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        raise NotImplementedError


class Aws(Provider):
    """IMDSv2: a session token first, then ``spot/instance-action`` (404 until a notice)."""

    name, notice_seconds = "aws", 120.0
    TOKEN_TTL = 21600

    def __init__(self) -> None:
        self._token: str | None = None
        self._token_at = 0.0

    def identify(self, client: Metadata) -> bool:
        return self._fresh_token(client) is not None

    def is_spot(self, client: Metadata) -> bool | None:
        reply = self._get(client, "/latest/meta-data/instance-life-cycle")
        return reply.text() == "spot" if reply.status == 200 else None

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        reply = self._get(client, "/latest/meta-data/spot/instance-action")
        if reply.status != 200:  # 404: no notice
            time.sleep(interval)
            return None
        try:
            action = json.loads(reply.body)
        except ValueError:
            action = {}
        return {"action": action.get("action"), "deadline": action.get("time")}

    def _get(self, client: Metadata, path: str) -> Reply:
        token = self._fresh_token(client)
        reply = client.request("GET", path, {"X-aws-ec2-metadata-token": token or ""})
        if reply.status == 401:  # the token expired early: one retry with a new one
            self._token = None
            reply = client.request("GET", path,
                                   {"X-aws-ec2-metadata-token": self._fresh_token(client) or ""})
        return reply

    def _fresh_token(self, client: Metadata) -> str | None:
        if self._token is None or time.monotonic() - self._token_at > self.TOKEN_TTL / 2:
            reply = client.request("PUT", "/latest/api/token",
                                   {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL)})
            self._token = reply.text() if reply.status == 200 else None
            self._token_at = time.monotonic()
        return self._token


class Gcp(Provider):
    """The metadata server's ``instance/preempted``, long-polled with ``wait_for_change``."""

    name, notice_seconds = "gcp", 30.0
    HEADERS: ClassVar[dict[str, str]] = {"Metadata-Flavor": "Google"}
    PATH = "/computeMetadata/v1/instance/preempted"

    def __init__(self) -> None:
        self._etag: str | None = None

    def identify(self, client: Metadata) -> bool:
        reply = client.request("GET", self.PATH, self.HEADERS)
        return reply.status == 200 and reply.headers.get("metadata-flavor") == "Google"

    def is_spot(self, client: Metadata) -> bool | None:
        reply = client.request("GET", "/computeMetadata/v1/instance/scheduling/preemptible",
                               self.HEADERS)
        return reply.text().upper() == "TRUE" if reply.status == 200 else None

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        query = ""
        if self._etag is not None:  # the first read answers at once; later ones wait
            query = f"?wait_for_change=true&timeout_sec={GCP_WAIT}&last_etag={self._etag}"
        reply = client.request("GET", self.PATH + query, self.HEADERS,
                               read_timeout=GCP_WAIT + READ_TIMEOUT)
        if reply.status != 200:
            raise Unreachable(f"{self.PATH}: HTTP {reply.status}")
        self._etag = reply.headers.get("etag")
        if reply.text().upper() == "TRUE":
            return {}
        if self._etag is None:  # a server without etags cannot long-poll: plain polling
            time.sleep(interval)
        return None


class Azure(Provider):
    """Scheduled events: a ``Preempt`` event comes at least 30 seconds ahead."""

    name, notice_seconds = "azure", 30.0
    HEADERS: ClassVar[dict[str, str]] = {"Metadata": "true"}
    EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"

    def identify(self, client: Metadata) -> bool:
        reply = client.request("GET", "/metadata/instance/compute/vmId?api-version=2021-02-01"
                               "&format=text", self.HEADERS)
        return reply.status == 200

    def is_spot(self, client: Metadata) -> bool | None:
        reply = client.request("GET", "/metadata/instance/compute/priority"
                               "?api-version=2021-02-01&format=text", self.HEADERS)
        return reply.text().lower() == "spot" if reply.status == 200 else None

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        # the first request switches the service on and may take a while to answer
        reply = client.request("GET", self.EVENTS, self.HEADERS, read_timeout=120.0)
        if reply.status != 200:
            raise Unreachable(f"scheduled events: HTTP {reply.status}")
        for event in _azure_events(reply.body):
            if event.get("EventType") == "Preempt":
                return {"event_id": event.get("EventId"), "deadline": event.get("NotBefore")}
        time.sleep(interval)
        return None


class Alibaba(Provider):
    """ECS metadata: ``instance/spot/termination-time`` answers 404 until the interruption
    notice, then the release time (UTC), about five minutes ahead. In the hardened mode
    every read needs a token from ``PUT /latest/api/token``; one is asked for first and
    used whenever the service hands one out."""

    name, notice_seconds, base = "alibaba", 300.0, ALIBABA_BASE
    TOKEN_TTL = 21600
    NOTICE = "/latest/meta-data/instance/spot/termination-time"

    def __init__(self) -> None:
        self._token: str | None = None
        self._token_at = 0.0

    def identify(self, client: Metadata) -> bool:
        reply = self._get(client, "/latest/meta-data/instance-id")
        return reply.status == 200 and reply.text().startswith("i-")

    def is_spot(self, client: Metadata) -> bool | None:
        return None  # ECS metadata does not say; $BURST_SPOT does (ACK spot node pools)

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        reply = self._get(client, self.NOTICE)
        if reply.status != 200 or not reply.text():  # 404: no notice yet
            time.sleep(interval)
            return None
        return {"action": "release", "deadline": reply.text()}

    def _get(self, client: Metadata, path: str) -> Reply:
        token = self._fresh_token(client)
        headers = {"X-aliyun-ecs-metadata-token": token} if token else {}
        reply = client.request("GET", path, headers)
        if reply.status in (401, 403) and token:  # expired early: one retry, a new token
            self._token = None
            token = self._fresh_token(client)
            reply = client.request("GET", path,
                                   {"X-aliyun-ecs-metadata-token": token} if token else {})
        return reply

    def _fresh_token(self, client: Metadata) -> str | None:
        if self._token is None or time.monotonic() - self._token_at > self.TOKEN_TTL / 2:
            reply = client.request("PUT", "/latest/api/token",
                                   {"X-aliyun-ecs-metadata-token-ttl-seconds":
                                    str(self.TOKEN_TTL)})
            self._token = reply.text() if reply.status == 200 and reply.text() else None
            self._token_at = time.monotonic()
        return self._token


class Kubernetes(Provider):
    """A pod: no metadata notice, SIGTERM is the notice (the run's handler saves) and
    ``terminationGracePeriodSeconds`` the time left; nothing to poll."""

    name = "kubernetes"

    def __init__(self, grace: float = DEFAULT_GRACE) -> None:
        self.notice_seconds = grace

    def identify(self, client: Metadata) -> bool:
        return True

    def is_spot(self, client: Metadata) -> bool | None:
        return None

    def poll(self, client: Metadata, interval: float) -> dict[str, Any] | None:
        raise NotImplementedError("a pod's notice is its SIGTERM")


def _azure_events(body: bytes) -> list[dict]:
    try:
        events = json.loads(body).get("Events") or []
    except (ValueError, AttributeError):
        return []
    return [e for e in events if isinstance(e, dict)]


PROVIDERS: dict[str, type[Provider]] = {"aws": Aws, "gcp": Gcp, "azure": Azure,
                                         "alibaba": Alibaba}
_SKYPILOT_CLOUDS = {"aws": "aws", "gcp": "gcp", "azure": "azure", "kubernetes": "probe",
                    "ssh": "probe"}
_PROBE_ORDER = ("gcp", "aws", "azure", "alibaba")
_NAMES = (*PROVIDERS, "kubernetes", "probe")


def detect(environ: Mapping[str, str] | None = None) -> str | None:
    """Which provider to watch (``aws``, ``gcp``, ``azure``, ``probe``), or None to start
    nothing. Decided from the environment alone: no packet leaves the machine here."""
    environ = os.environ if environ is None else environ
    explicit = (environ.get(ENV_PROVIDER) or "").strip().lower()
    if explicit in ("off", "none", "0", "false"):
        return None
    if explicit in _NAMES:
        return explicit
    if explicit:
        _say(f"${ENV_PROVIDER}={explicit!r} is not one of {', '.join(_NAMES)}, off: "
             "not watching for preemption")
        return None
    try:
        cloud = str(json.loads(environ.get(CLUSTER_INFO_ENV) or "{}").get("cloud") or "")
    except (ValueError, AttributeError):
        cloud = ""
    found = _SKYPILOT_CLOUDS.get(cloud.lower())
    if found is None and environ.get(ENV_METADATA_URL):
        return "probe"
    return found


@dataclass(frozen=True)
class Notice:
    provider: str
    seen: str  # when the watcher saw it (UTC, ISO 8601)
    detail: dict[str, Any] = field(default_factory=dict)


class Watcher:
    """Polls one provider's notice on a daemon thread; see the module docstring."""

    def __init__(self, provider: str, target: Target, *, base_url: str | None = None,
                 poll: float = DEFAULT_POLL, max_lost_seconds: float | None = None,
                 spot: bool | None = None, grace: float | None = None) -> None:
        self.requested = provider
        self.target = target
        self.base_url = base_url  # None: each provider's own metadata address
        self.client = Metadata(base_url or DEFAULT_BASE)
        self.grace = grace  # a pod's grace period (None: not known to be a pod)
        self.poll = poll
        self.max_lost_seconds = max_lost_seconds
        self.provider: Provider | None = None
        self.spot = spot  # None until the metadata says (or the environment forces it)
        self._spot_forced = spot is not None
        self.notice: Notice | None = None
        self.gave_up: str | None = None  # why the watch ended without a notice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="burst-preemption",
                                        daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current poll (a GCP long poll may finish first: a daemon thread)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the watch to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def bound(self) -> float | None:
        """The most work a preemption may cost: the user's, else the notice period."""
        if self.max_lost_seconds is not None:
            return self.max_lost_seconds
        return self.provider.notice_seconds if self.provider else None

    def persist_seconds(self, configured: float | None, cost: float) -> float | None:
        """The persist interval to use now. ``cost`` is how long the newest snapshot took
        from commit to stored. On a spot node a snapshot taken every ``interval`` seconds
        is stored at most ``interval + cost`` seconds after the work it holds, so the
        interval is ``bound - cost`` (never below the cost itself or a few seconds: a
        bound that cannot be met means persisting as fast as uploads go)."""
        bound = self.bound
        if not self.spot or bound is None:
            return configured
        interval = max(bound - cost, cost, MIN_PERSIST_SECONDS)
        return interval if configured is None else min(configured, interval)

    # -- the thread -----------------------------------------------------------------------

    def _watch(self) -> None:
        try:
            self.provider = self._first_contact()
        except Unreachable as exc:  # not a cloud, or no metadata service: quietly done
            self.gave_up = f"no metadata server: {exc}"
        if self.provider is None and self.grace is not None:
            self.provider = Kubernetes(self.grace)  # a pod: SIGTERM, then its grace
        if self.provider is None:
            self.gave_up = self.gave_up or "no known metadata server answered"
            return
        if isinstance(self.provider, Kubernetes):
            return  # nothing to poll: the bound is all a pod's watch gives
        failures = 0
        while not self._stop.is_set():
            try:
                detail = self.provider.poll(self.client, self.poll)
            except Unreachable as exc:
                failures += 1
                if failures >= MAX_FAILURES:
                    self.gave_up = f"{failures} polls failed, the last: {exc}"
                    return
                self._stop.wait(min(self.poll * 2 ** failures, 30.0))
                continue
            failures = 0
            if detail is not None and not self._stop.is_set():
                self._noticed(detail)
                return

    def _first_contact(self) -> Provider | None:
        """The provider, its metadata server reached once, and whether the node is spot.

        A probe asks each cloud's server in turn; an address that does not answer at all
        is not asked again (AWS, GCP and Azure share 169.254.169.254; Alibaba's is
        100.100.100.200). Unreachable when none answered."""
        if self.requested == "kubernetes":
            return None
        names = _PROBE_ORDER if self.requested == "probe" else (self.requested,)
        dead: dict[str, Unreachable] = {}
        for name in names:
            provider = PROVIDERS[name]()
            base = self.base_url or provider.base
            if base in dead:
                continue
            self.client = Metadata(base)
            try:
                known = provider.identify(self.client)
            except Unreachable as exc:
                dead[base] = exc
                continue
            if known:
                if not self._spot_forced:
                    with contextlib.suppress(Unreachable):
                        self.spot = provider.is_spot(self.client)
                return provider
        if dead and len(dead) == len({self.base_url or PROVIDERS[n].base for n in names}):
            raise next(iter(dead.values()))
        return None

    def _noticed(self, detail: dict[str, Any]) -> None:
        assert self.provider is not None
        seen = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.notice = Notice(self.provider.name, seen, detail)
        _say(f"{self.provider.name} preemption notice: snapshot at the next step boundary, "
             "then upload it")
        self.target.request_snapshot(Reason.PREEMPTION)  # first: the event is worth less
        with contextlib.suppress(Exception):
            self.target.record_event(EVENT, provider=self.provider.name, seen=seen,
                                     spot=self.spot,
                                     **{k: v for k, v in detail.items() if v is not None})


def start(target: Target, max_lost_seconds: float | None = None,
          environ: Mapping[str, str] | None = None) -> Watcher | None:
    """Start watching if this is a cloud node (see :func:`detect`); None otherwise."""
    environ = os.environ if environ is None else environ
    provider = detect(environ)
    if provider is None:
        return None
    try:
        in_pod = provider == "kubernetes" or bool(environ.get(POD_ENV))
        watcher = Watcher(provider, target, base_url=environ.get(ENV_METADATA_URL),
                          poll=_float(environ, ENV_POLL) or DEFAULT_POLL,
                          max_lost_seconds=(max_lost_seconds if max_lost_seconds is not None
                                            else _float(environ, ENV_MAX_LOST)),
                          spot=_spot(environ),
                          grace=(_float(environ, ENV_GRACE) or DEFAULT_GRACE) if in_pod
                          else None)
    except ValueError as exc:
        _say(f"not watching for preemption: {exc}")
        return None
    return watcher.start()


def _float(environ: Mapping[str, str], name: str) -> float | None:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"${name} must be positive, got {raw!r}")
    return value


def _spot(environ: Mapping[str, str]) -> bool | None:
    raw = (environ.get(ENV_SPOT) or "").strip().lower()
    return {"1": True, "true": True, "0": False, "false": False}.get(raw)


def _say(message: str) -> None:
    print(f"burst: {message}", file=sys.stderr, flush=True)

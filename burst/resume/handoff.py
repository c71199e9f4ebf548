"""``burst resume``: continue a stopped run somewhere else, from its newest snapshot.

The steps, each of which can stop the resume with a one-line reason before anything is
launched:

1. a newer snapshot in the local tier (the crash happened before its upload) is pushed;
2. the newest complete snapshot in the store is the starting point;
3. the environment record is checked: a node can only rebuild a run that was frozen;
   the entry point is made to travel with the code archive (:mod:`burst.resume.entrypoint`:
   this machine's paths become paths in the archive; a script outside it is refused);
4. the planner ranks where the run fits (spot first, then on-demand; cards, places);
5. the run's wheelhouse is made sure of in the store (built and uploaded if missing: the
   node installs burst and the lockfile from it, with no package index), and the task is
   rendered from ``templates/`` and parsed back with SkyPilot's parser;
6. a launcher runs it (SkyPilot, an SSH box, or the local stub) and streams progress.

Launch and its end are events in the run's history, so ``burst status`` can say where the
run went. Credentials travel as SkyPilot secrets: names in the task, values only in memory.
They must outlast the run: temporary ones (a session token) expire mid-run, after which the
node's uploads fail and the next resume starts from an old snapshot, so they are refused
unless asked for (then warned about). ``node_identity = "own"`` forwards no store keys at
all: the node uses its own identity (an instance role). Nothing that only holds here
travels as if it held there: local paths stay off the task; an OSS node tries its region's
``-internal`` endpoint first (reachable only inside the region's VPC) and falls back to the
public one; loopback, link-local and private endpoints and mirrors are refused for a remote
node (:mod:`burst.resume.reach`).
"""

from __future__ import annotations

import filecmp
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from burst import events
from burst.contract import (
    ENV_LOCKFILE_DIGEST,
    ENV_PLAN_AMP,
    ENV_PLAN_MARGIN,
    ENV_PLAN_MICRO_BATCH,
    ENV_PYTHON,
    ENV_RUN_ID,
    ENV_SPEC,
    ENV_STORE,
)
from burst.env import codearchive, freeze, interpreter, wheelchoice
from burst.env import wheelhouse as wheels
from burst.env.lockfile import Lockfile, LockfileError
from burst.errors import BurstError, ConfigError, SnapshotError
from burst.inputs import part as inputs_part
from burst.launch import Launcher, LaunchResult, Reporter, skyenv
from burst.launch.task import (
    CA_BUNDLE_ENV,
    CA_BUNDLE_LIMIT,
    NodeSoftware,
    RenderedTask,
    TaskSpec,
    render,
)
from burst.node import restarts
from burst.plan import planner
from burst.plan.replan import Replan, replan
from burst.resume import bucket_region, entrypoint, mirrors, reach, wheelpolicy
from burst.resume import status as run_status
from burst.snapshot import reader, sync
from burst.store import Store, is_local, open_store
from burst.store.oss import public_endpoint
from burst.store.settings import OPTIONS, as_bool, resolve

SECRET_NAMES = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    "oss": ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN"),
}
PER_TIER = 16  # candidates kept per tier: SkyPilot tries each in turn, on failure
# Settings that name a file on this machine: a node has no such path, so they never go
# into the task (the profile's values travel as secrets; the node brings its own files).
LOCAL_ONLY_SETTINGS = ("profile", "ca_bundle", "ssh_config", "known_hosts", "identity_file")
# Settings that describe this machine's network: never forwarded as they are (see below).
HERE_ONLY_SETTINGS = ("internal",)
TEMPORARY = ("AWS_SESSION_TOKEN", "OSS_SESSION_TOKEN")  # their presence: keys that expire
NODE_IDENTITIES = ("forward", "own")  # node_identity: pass our keys on, or none at all


@dataclass
class Request:
    """What the user asked for."""

    run_id: str
    store_url: str
    local_url: str
    cards: Sequence[str] = ()
    region: str = "any"
    infra: Sequence[str] = ()
    counts: Sequence[int] = (1,)
    nodes: int = 1
    options: planner.Options = field(default_factory=planner.Options)
    micro_batch: int | None = None
    command: Sequence[str] = ()
    software: NodeSoftware = field(default_factory=lambda: NodeSoftware(None, default_spec()))
    secrets: Sequence[str] = ()  # extra environment variables to pass as secrets
    managed: bool = True
    max_restarts: int = 3
    max_preemptions: int = restarts.DEFAULT_MAX_PREEMPTIONS
    preemption_hours: float | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    skypilot_catalog: bool = False
    remote_node: bool = True  # False only for the local stub: it can read a local store
    dry_run: bool = False  # show everything, change nothing (no push, no launch)
    temporary_credentials: bool = False  # True: forward a session token, with a warning
    private_endpoints: bool = False  # True: the node shares this network (reach.FLAG)
    to: str = "skypilot"  # the launcher: skypilot, local, ssh://... (the wheelhouse default)
    wheels: wheelchoice.Choice = field(default_factory=wheelchoice.Choice)  # --wheels ...


@dataclass
class Prepared:
    """Everything decided before launching: what ``--dry-run`` shows."""

    request: Request
    store: Store
    step: int
    pushed: int | None
    environment: dict[str, Any]
    command: list[str]
    plans: Replan
    candidates: list[planner.Plan]
    task: RenderedTask
    secrets: dict[str, str] = field(repr=False)
    warnings: list[str] = field(default_factory=list)


def default_spec() -> str:
    """What the node pip-installs to get burst: this version, from the package index."""
    from burst import __version__

    return os.environ.get(ENV_SPEC) or f"burst-failover=={__version__}"


def prepare(request: Request, say: Callable[[str], None] = print) -> Prepared:
    """Steps 1 to 5: everything but the launch; raises on anything a launch would trip on."""
    store = open_store(request.store_url)
    warnings: list[str] = []
    if request.remote_node and is_local(store):
        unreachable = (f"the store {store.url} is on this machine, where a cloud or SSH node "
                       "cannot read it: push the run to s3://, oss://, gs:// or sftp:// "
                       "(burst push) and resume from there")
        if not request.dry_run:
            raise ConfigError(unreachable)
        warnings.append(unreachable)
    if request.software.python is None and urlparse(store.url).scheme == "gs":
        unreadable = (f"the store {store.url} is gs://, which the node's bootstrap cannot read "
                      "(it reads s3://, oss://, sftp://): use the bucket through GCS's "
                      "S3-compatible API (s3://BUCKET, endpoint_url = "
                      "https://storage.googleapis.com, HMAC keys as AWS_ACCESS_KEY_ID/"
                      "AWS_SECRET_ACCESS_KEY), or a node with burst installed (--node-python)")
        if not request.dry_run:
            raise ConfigError(unreadable)
        warnings.append(unreadable)
    secrets, secret_warnings = secret_values(request)  # before anything changes
    warnings += secret_warnings
    pushed = None if request.dry_run else push_newer_local(store, request, say)
    manifest = reader.read_manifest(store, request.run_id)
    if manifest is None:
        raise SnapshotError(f"run {request.run_id!r} has no complete snapshot in {store.url}")
    lock, code_ref = frozen_record(store, request, warnings)
    environment = environment_record(lock, code_ref, warnings)
    # the run's data and hub caches: refused here if one cannot travel, completed if the
    # run died before staging them all (burst.inputs)
    input_warnings, hub_mirrors = inputs_part.for_resume(store, request.run_id,
                                                         dry_run=request.dry_run, say=say)
    warnings += input_warnings
    travelled = travel(store, request.run_id, code_ref,
                       list(request.command) or recorded_command(store, request))
    warnings += travelled.warnings
    command = travelled.command
    plans = replan(store, request.run_id, cards=request.cards, region=request.region,
                   infra=request.infra, counts=request.counts, nodes=request.nodes,
                   options=request.options, config=request.config,
                   skypilot=request.skypilot_catalog)
    candidates = fitting(plans, request.micro_batch)
    envs = task_envs(request, lock, warnings)
    warnings += bucket_region.forward(store, envs)  # the node signs for the bucket's own
    envs.update(hub_mirrors)  # the hub mirror the user prefers to the cache's files
    mirror_envs, mirror_secrets = ({}, {}) if request.software.python is not None \
        else mirrors.forwarded()
    mirror_envs.update(interpreter.forwarded() if request.software.python is None else {})
    if request.remote_node:  # before anything is built or shipped for a node that cannot go
        warnings += reach.check_endpoints(store_addresses(envs), request.private_endpoints,
                                          request.dry_run)
        for forwarded in (mirror_envs, mirror_secrets):
            warnings += reach.drop_mirrors(forwarded, request.private_endpoints)
    if request.software.python is None:  # the node bootstraps: it needs the wheelhouse
        warnings += ensure_wheelhouse(store, request, lock, say,
                                      wheel_decision(store, request, lock, candidates,
                                                     environment, envs))
        warnings += ensure_node_python(store, request, lock, candidates, environment, say)
        envs.update(mirror_envs)
        secrets.update(mirror_secrets)
    spec = TaskSpec(request.run_id, manifest["step"], str(manifest.get("reason", "?")),
                    task_name(request.run_id), candidates, command, envs,
                    sorted(secrets), request.software, request.managed, request.max_restarts,
                    request.max_preemptions, request.preemption_hours,
                    workdir=travelled.workdir)
    task = render(spec)
    if task.checked_by is None:
        say(f"SkyPilot is not installed, so its parser did not check the task (the local "
            f"stub and ssh run it as it is; for clouds: {skyenv.INSTALL})")
    _check_no_secret(task, secrets)
    return Prepared(request, store, manifest["step"], pushed, environment, command, plans,
                    candidates, task, secrets, warnings)


def launch(prepared: Prepared, launcher: Launcher, report: Reporter) -> LaunchResult:
    """Step 6: launch, stream, and record where the run went and how it ended."""
    store, run_id = prepared.store, prepared.request.run_id
    record = _recorder(store, run_id, report)
    record("launch", to=launcher.kind, name=prepared.task.name, step=prepared.step,
           candidates=[label(p) for p in prepared.candidates],
           command=shlex.join(prepared.command))
    report = Reporter(report.say, record, report.output)
    result = launcher.launch(prepared.task, prepared.secrets, report)
    record("launch-end", to=launcher.kind, where=result.where, returncode=result.returncode,
           **result.details)
    return result


class Attachable(Protocol):
    """A launcher that can pick up a job it started detached (the ``ssh`` one)."""

    kind: str

    def attach(self, directory: str, pid: int, report: Reporter) -> LaunchResult:
        """Tail the job in ``directory`` (process ``pid``) until it ends."""


def attach(store: Store, run_id: str, launcher_for: Callable[[str], Attachable],
           report: Reporter, local: Store | None = None) -> LaunchResult:
    """Re-attach to the run's detached job (``burst resume RUN --attach``): the newest
    ``ssh-job`` event says where it runs; its log is tailed from the start until it ends,
    and its end is recorded if the resume that started it did not live to record it. The
    result's code is the job's own meaning (its nodes' events), as for a launch."""
    job = run_status.detached_job(run_status.merged_events(store, run_id, local))
    if job is None:
        raise ConfigError(f"run {run_id!r} has no detached job in {store.url} to attach to "
                          "(only burst resume --to ssh:// leaves one)")
    launcher = launcher_for(job["target"])
    record = _recorder(store, run_id, report)
    report.say(f"attaching to {job['where']} (pid {job['pid']}, started {job['since']})")
    result = launcher.attach(job["dir"], job["pid"], Reporter(report.say, record, report.output))
    if not job["ended"]:
        record("launch-end", to=launcher.kind, where=result.where,
               returncode=result.returncode, attached=True, **result.details)
    code = run_status.job_ended_with(store, run_id, str(job["since"]), result.returncode)
    return LaunchResult(code, result.where, result.details)


def _recorder(store: Store, run_id: str, report: Reporter) -> Callable[..., None]:
    def record(name: str, /, **fields: Any) -> None:
        events.record(store, run_id, name, say=report.say, source="resume", **fields)
        report.event(name, **fields)

    return record


# -- step 1: a newer local snapshot goes up first -----------------------------------------


def push_newer_local(store: Store, request: Request, say: Callable[[str], None]) -> int | None:
    """Push the local tier's newest snapshot if the store has nothing as new."""
    if is_local(store) and Path(getattr(store, "root", "")) == Path(request.local_url):
        return None
    try:
        local = open_store(request.local_url)
    except BurstError:
        return None
    if local.url == store.url:
        return None
    local_steps = reader.list_steps(local, request.run_id)
    remote_steps = reader.list_steps(store, request.run_id)
    if not local_steps or (remote_steps and remote_steps[-1] >= local_steps[-1]):
        return None
    say(f"pushing the newer local snapshot {request.run_id}@{local_steps[-1]} to {store.url}")
    sync.push(local, store, request.run_id)
    return local_steps[-1]


# -- step 3: the environment record -------------------------------------------------------


def frozen_record(store: Store, request: Request, warnings: list[str]
                  ) -> tuple[Lockfile | None, dict[str, Any] | None]:
    """The lockfile and code the node will rebuild; a missing lockfile stops the resume
    unless the node brings its own environment (``--node-python``)."""
    try:
        return freeze.load_frozen(store, request.run_id)
    except LockfileError as exc:
        if request.software.python is None:
            raise BurstError(f"{exc}; or pass --node-python for a node that already has the "
                             "environment") from None
        warnings.append(f"no frozen environment: the node's {request.software.python} is "
                        "used unchecked")
        return None, codearchive.latest_ref(store, request.run_id)


def environment_record(lock: Lockfile | None, code_ref: dict[str, Any] | None,
                       warnings: list[str]) -> dict[str, Any]:
    """What the node will rebuild, for printing."""
    if lock is None:
        return {"lockfile": None, "code": (code_ref or {}).get("archive")}
    torch = lock.package("torch")
    not_portable = [p.name for p in lock.packages if not p.installable and p.in_code is None]
    if not_portable:
        warnings.append(f"not portable (the node cannot install them): "
                        f"{', '.join(not_portable)}")
    if not code_ref:
        warnings.append("no code archive: the entry point must already be on the node")
    return {"lockfile": lock.digest, "python": lock.python.get("version"),
            "torch": torch.version if torch else None, "packages": len(lock.packages),
            "not_portable": not_portable,
            "code": (code_ref or {}).get("archive")}


def travel(store: Store, run_id: str, code_ref: dict[str, Any] | None,
           command: list[str]) -> entrypoint.Relocated:
    """The command as the node runs it, from ``code/<cwd>`` of the restored archive; the
    archive is fetched (and its hash checked) to know what it holds."""
    if not code_ref:
        return entrypoint.Relocated(entrypoint.node_program(command))
    with tempfile.TemporaryDirectory(prefix="burst-code-") as tmp:
        members = set(codearchive.restore(store, run_id, code_ref, tmp))

        def same(local: str, member: str) -> bool:
            """This machine's file is the archived one (or is gone: nothing to compare)."""
            if not os.path.isfile(local):
                return not os.path.exists(local)
            return filecmp.cmp(local, os.path.join(tmp, member), shallow=False)

        return entrypoint.relocate(command, members, code_ref.get("cwd", "."),
                                   exists=os.path.isdir, same=same)


def wheel_decision(store: Store, request: Request, lock: Lockfile | None,
                   candidates: Sequence[planner.Plan], environment: dict[str, Any],
                   envs: dict[str, str]) -> wheelpolicy.Decision | None:
    """The wheelhouse the node gets (:mod:`burst.resume.wheelpolicy`), said in the
    environment record and passed on to the node, whose own freeze stores wheels the same
    way; a choice on this command line is recorded for the next resume."""
    if lock is None:
        return None
    if not request.wheels.empty and not request.dry_run:
        wheelchoice.record(store, request.run_id, request.wheels)
    decision = wheelpolicy.decide(
        lock, flags=request.wheels, recorded=wheelchoice.recorded(store, request.run_id),
        stored=wheels.load_index(store, request.run_id, lock.digest), candidates=candidates,
        to=request.to)
    environment["wheelhouse"] = decision.why
    target = decision.target
    envs.update({wheels.POLICY_ENV: target.policy, wheels.MACHINE_ENV: target.machine})
    if target.torch_variant:
        envs[wheels.TORCH_VARIANT_ENV] = target.torch_variant
    return decision


def ensure_wheelhouse(store: Store, request: Request, lock: Lockfile | None,
                      say: Callable[[str], None],
                      decision: wheelpolicy.Decision | None = None) -> list[str]:
    """Make sure the store holds the wheelhouse the node's bootstrap installs from (built
    here, where a package index is reachable); a dry run only says whether it is there."""
    if lock is None:
        return []
    target = decision.target if decision is not None else wheels.target_for(lock)
    if target.policy == "none":
        return [f"${wheels.POLICY_ENV}=none: no wheelhouse, the node needs a package mirror "
                "($BURST_INDEX_URL) for burst and every dependency"]
    existing = wheels.load_index(store, request.run_id, lock.digest)
    if existing is not None and existing.get("target") == target.to_json():
        return []
    if request.dry_run:
        return [f"no wheelhouse for lockfile {lock.digest[:12]} ({target.machine}, python "
                f"{target.python}, torch {target.torch_variant}) in the store yet: the resume "
                "builds and uploads it first"]
    say(f"building the wheelhouse of lockfile {lock.digest[:12]} for {target.machine} / "
        f"python {target.python} / torch {target.torch_variant}")
    uploaded = wheels.ensure(store, request.run_id, lock, target, say=say)
    if uploaded is not None:
        say(f"wheelhouse: {uploaded.wheels_sent} wheel(s) uploaded "
            f"({uploaded.bytes_sent / 1e6:.1f} MB), {uploaded.wheels_present} already there")
        missing = uploaded.index.get("missing") or []
        if missing:
            names = ", ".join(m["name"] for m in missing[:8])
            return [f"not in the wheelhouse (the node asks a mirror): {names}"]
    return []


def store_addresses(envs: Mapping[str, str]) -> dict[str, str]:
    """The store addresses a node dials, by the name it gets them under: the store's
    endpoint, an SFTP store's host."""
    out = {}
    endpoint = envs.get(OPTIONS["endpoint_url"])
    if endpoint:
        out[OPTIONS["endpoint_url"]] = endpoint
    store = envs.get(ENV_STORE, "")
    if urlparse(store).scheme == "sftp":
        out[ENV_STORE] = store
    return out


def ensure_node_python(store: Store, request: Request, lock: Lockfile | None,
                       candidates: Sequence[planner.Plan], environment: dict[str, Any],
                       say: Callable[[str], None]) -> list[str]:
    """Decide how the node gets the lock's Python (:mod:`burst.env.interpreter`), say it
    in the environment record, and ship a standalone interpreter to the store when that
    is the way (a dry run only says so)."""
    if lock is None:
        return []
    chosen = interpreter.route(lock, [p.target.place.image_id for p in candidates])
    environment["node_python"] = f"{chosen.kind}: {chosen.why}"
    if chosen.standalone is None:
        return [] if chosen.kind == "image" else [chosen.why]
    key = wheels.index_key(request.run_id, lock.digest)
    if store.size(key) is None:
        return [f"no wheelhouse index to name the shipped Python in ({wheels.POLICY_ENV}="
                f"none?): the node needs Python {chosen.python} of its own"]
    if not request.dry_run:
        entry = interpreter.ship(store, chosen.standalone,
                                 wheels.cache_dir() / "interpreters", say)
        interpreter.record(store, key, entry)
    return []


#: the events that name the command a run was started with: the agent's start of its child
#: (``burst run -- python train.py``), and the run's own start or resume when it was started
#: without the agent (``python train.py``; burst.training.command)
COMMAND_EVENTS = ("child-start", "start", "resume")


def recorded_command(store: Store, request: Request) -> list[str]:
    """The entry point the run was last started with."""
    history = events.read(store, request.run_id)
    try:
        local = open_store(request.local_url)
        if local.url != store.url:
            history += events.read(local, request.run_id)
    except BurstError:
        pass
    starts = sorted((e for e in history
                     if e.get("event") in COMMAND_EVENTS and isinstance(e.get("command"), str)
                     and e["command"].strip()),
                    key=lambda e: str(e.get("time")))
    if not starts:
        raise ConfigError("the run's history names no training command: give it after --, "
                          "e.g. burst resume RUN --to local -- python train.py")
    try:
        command = shlex.split(starts[-1]["command"])
    except ValueError:
        raise ConfigError(f"the run's history names an unreadable command "
                          f"({starts[-1]['command'][:80]!r}): give it after --") from None
    return command  # its interpreter becomes the node's in travel()


# -- step 4: the candidates -----------------------------------------------------------------


def fitting(plans: Replan, micro_batch: int | None) -> list[planner.Plan]:
    """The fitting candidates in failover order (with a forced micro-batch applied).

    Each tier (own capacity, spot, on-demand, in the planner's order) keeps its first
    ``PER_TIER`` entries: a long spot list must not push every on-demand fallback out of
    the task."""
    chosen = [p for p in plans.plans if p.fits]
    if not chosen:
        plans.choose()  # raises the most useful reason
    tiers = [p.target.tier for p in chosen]
    chosen = [p for i, p in enumerate(chosen) if tiers[:i].count(tiers[i]) < PER_TIER]
    if micro_batch is not None:
        chosen = [p.with_micro_batch(micro_batch) for p in chosen]
    return chosen


def label(plan: planner.Plan) -> str:
    target = plan.target
    return (f"{target.count}x {target.card.name}"
            f"{f' x{target.nodes} nodes' if target.nodes > 1 else ''} at "
            f"{target.place.label} ({'spot' if target.spot else 'on-demand'})")


# -- step 5: envs and secrets ---------------------------------------------------------------


def task_envs(request: Request, lock: Lockfile | None = None,
              warnings: list[str] | None = None) -> dict[str, str]:
    """The run id, the store and its non-secret settings, the planning policy, and the
    lockfile the node installs (its digest and Python); why a setting changed on the way
    goes to ``warnings``."""
    url, options = resolve(request.store_url)
    if urlparse(url).scheme in ("", "file"):
        url = open_store(url).url  # absolute: the node's working directory is another
    envs = {ENV_RUN_ID: request.run_id, ENV_STORE: url, "PYTHONUNBUFFERED": "1",
            ENV_PLAN_AMP: request.options.amp, ENV_PLAN_MARGIN: str(request.options.margin)}
    if request.micro_batch is not None:
        envs[ENV_PLAN_MICRO_BATCH] = str(request.micro_batch)
    if lock is not None:
        envs[ENV_LOCKFILE_DIGEST] = lock.digest
        python = ".".join(str(lock.python.get("version", "")).split(".")[:2])
        if python:
            envs[ENV_PYTHON] = python
    if request.software.python is None and request.software.burst_spec:
        envs[ENV_SPEC] = request.software.burst_spec
    for name, value in node_settings(request, options, warnings).items():
        envs[OPTIONS[name]] = value
    pem = _ca_certificate(options.get("ca_bundle"))
    if pem is not None:
        envs[CA_BUNDLE_ENV] = pem
    # the wheelhouse policy the user chose follows the run: a node that freezes its own
    # environment again stores (or does not store) wheels the same way
    for name in (wheels.POLICY_ENV, wheels.MACHINE_ENV, wheels.TORCH_VARIANT_ENV):
        if os.environ.get(name):
            envs[name] = os.environ[name]
    return envs


def node_settings(request: Request, options: Mapping[str, Any],
                  warnings: list[str] | None = None) -> dict[str, str]:
    """The store settings as they hold on the node: local paths dropped, and for an OSS
    store ``internal = "auto"``: a node inside the bucket's region (its VPC) reaches the
    internal endpoint, with no NAT gateway and no traffic billed, and tries it first; any
    other node falls back to the public one (:func:`burst.store.oss.internal_first`)."""
    said = warnings if warnings is not None else []
    out = {name: str(value) for name, value in options.items()
           if name not in LOCAL_ONLY_SETTINGS + HERE_ONLY_SETTINGS and value is not None}
    if not request.remote_node:
        out.update({n: str(options[n]) for n in HERE_ONLY_SETTINGS if options.get(n) is not None})
        return out
    url, _ = resolve(request.store_url)
    if urlparse(url).scheme.lower() != "oss" or as_bool(options, "bucket_endpoint", False):
        return out
    endpoint = out.get("endpoint_url")
    public = public_endpoint(endpoint) if endpoint else None
    if public is not None:  # an internal endpoint given: its public twin is the fallback
        out["endpoint_url"], out["internal_endpoint"] = public, str(endpoint)
        said.append(f"the store's endpoint {endpoint} is an OSS internal one: a node inside "
                    f"its region's VPC uses it, any other {public}")
    if str(options.get("internal", "auto")).strip().lower() not in ("0", "false", "no", "off"):
        out["internal"] = "auto"
    return out


def _ca_certificate(path: str | None) -> str | None:
    """The store's CA bundle as text for the task, when it is a small PEM file."""
    if not path:
        return None
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"the store's ca_bundle {path}: {exc.strerror or exc}") from None
    if len(data) > CA_BUNDLE_LIMIT or b"-----BEGIN CERTIFICATE-----" not in data:
        return None  # not carried: secret_values() warns that the node needs its own
    return data.decode("ascii", errors="replace")


def secret_values(request: Request) -> tuple[dict[str, str], list[str]]:
    """Credential values the node needs, read from this machine; never written anywhere."""
    url, options = resolve(request.store_url)
    scheme = urlparse(url).scheme.lower()
    identity = str(options.get("node_identity") or "forward").strip().lower()
    if identity not in NODE_IDENTITIES:
        raise ConfigError(f"store setting node_identity must be one of "
                          f"{', '.join(NODE_IDENTITIES)}, got {identity!r}")
    values: dict[str, str] = {}
    warnings = []
    if identity == "forward":
        values = {n: os.environ[n] for n in SECRET_NAMES.get(scheme, ()) if os.environ.get(n)}
        if scheme == "s3" and "AWS_ACCESS_KEY_ID" not in values:
            values.update(_profile_credentials(options.get("profile")))
        if scheme in SECRET_NAMES and not values and request.remote_node:
            names = " and ".join(SECRET_NAMES[scheme][:2])
            warnings.append(f"no {scheme} credentials here to pass on: set {names}, or "
                            "node_identity = \"own\" for a node with its own (an instance "
                            "role)")
        warnings += _temporary(request, scheme, values)
    if scheme in ("gs", "sftp") and request.remote_node:
        warnings.append(f"{scheme}:// credentials are files; the node needs its own "
                        "(burst never copies key files)")
    for name in LOCAL_ONLY_SETTINGS[1:]:
        carried = name == "ca_bundle" and _ca_certificate(options.get(name)) is not None
        if options.get(name) and request.remote_node and not carried:
            warnings.append(f"the store's {name} names a file on this machine, which the node "
                            f"does not have: give the node its own ({OPTIONS[name]})")
    for name in request.secrets:
        if not os.environ.get(name):
            raise ConfigError(f"--secret {name}: ${name} is not set here")
        values[name] = os.environ[name]
    return values, warnings


def _temporary(request: Request, scheme: str, values: Mapping[str, str]) -> list[str]:
    """Refuse (or, when asked, warn about) store keys that carry a session token."""
    token = next((name for name in TEMPORARY if name in values), None)
    if token is None:
        return []
    problem = (f"the {scheme} credentials here are temporary (they carry ${token}) and would "
               "expire mid-run, so a later resume starts from an old snapshot: use long-lived "
               "scoped keys, or node_identity = \"own\" for a node with its own role, or "
               "pass --allow-temporary-credentials")
    if request.temporary_credentials or request.dry_run:
        return [problem]
    raise ConfigError(problem)


def _profile_credentials(profile: str | None) -> dict[str, str]:
    """Credentials of an AWS profile (local files only), so a profile user can resume."""
    if not profile:
        return {}
    import boto3

    credentials = boto3.Session(profile_name=profile).get_credentials()
    if credentials is None:
        return {}
    frozen = credentials.get_frozen_credentials()
    out = {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
    if frozen.token:
        out["AWS_SESSION_TOKEN"] = frozen.token
    return out


def _check_no_secret(task: RenderedTask, secrets: Mapping[str, str]) -> None:
    """Defence in depth: a secret value in the YAML would end up in logs and dashboards."""
    for name, value in secrets.items():
        if len(value) >= 4 and value in task.yaml:
            raise BurstError(f"refusing to launch: the value of secret {name} appears in the "
                             "rendered task (a setting that should not hold it?)")


def task_name(run_id: str) -> str:
    """A SkyPilot-safe name: lower case letters, digits and dashes, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"burst-{run_id}".lower()).strip("-")
    return name[:48].rstrip("-")

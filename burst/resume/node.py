"""The node side of a resume: what ``burst node setup`` and ``burst node run`` do there.

A resumed run lands on a machine burst has never seen. ``setup`` restores the run's code
and builds its frozen environment (or, on a prepared node, checks the one that is there);
``run`` pulls the newest complete snapshot, checks the environment again, re-plans the
micro-batch, accumulation and precision for the card it actually finds (NVML; the launch
side only guessed), and runs the user's entry point under the agent with that plan in the
environment. New snapshots go to the same store and run id, so a failure here resumes
again from there. In a managed job each start is counted in the store first, and a start
past the restart bound trains nothing (:mod:`burst.node.restarts`). Everything comes
from the task's environment: ``BURST_RUN_ID``, ``BURST_STORE`` (+ its settings),
``BURST_PLAN_*``, ``BURST_MAX_RESTARTS`` and SkyPilot's ``SKYPILOT_*``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from burst import config as user_config
from burst import events
from burst.contract import (
    ENV_LOCAL,
    ENV_NODE_DIR,
    ENV_NODE_GPU,
    ENV_PLAN_AMP,
    ENV_PLAN_MARGIN,
    ENV_PLAN_MICRO_BATCH,
    ENV_RUN_ID,
    ENV_STORE,
    Exit,
    PlanEnv,
)
from burst.env import check as envcheck
from burst.env import codearchive, freeze
from burst.env import install as envinstall
from burst.env import machine as envfacts
from burst.env import rebuild as envrebuild
from burst.env.lockfile import LockfileError
from burst.errors import BurstError, ConfigError
from burst.inputs import place as inputs_place
from burst.node import restarts
from burst.plan import planner
from burst.plan.replan import replan
from burst.resume import entrypoint
from burst.resume import status as run_status
from burst.snapshot import reader, sync
from burst.store import Store, open_store
from burst.supervise.agent import Agent, Policy
from burst.training import failure

PULL_EVENT = "node-pull"  # a node's snapshot download: its bytes and seconds

Say = Callable[[str], None]


def node_dir() -> Path:
    """``$BURST_NODE_DIR``, else ``~/burst-node``: code, venv and local snapshots live here."""
    return Path(os.environ.get(ENV_NODE_DIR) or Path.home() / "burst-node")


def run_identity(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The run id and store URL the task carries."""
    environ = os.environ if environ is None else environ
    run_id, store = environ.get(ENV_RUN_ID), environ.get(ENV_STORE)
    if not run_id or not store:
        raise ConfigError("burst node needs $BURST_RUN_ID and $BURST_STORE (set by the task)")
    return run_id, store


# -- setup --------------------------------------------------------------------------------


def setup(run_id: str, store: Store, *, python: str | None, venv: Path, code_dir: Path,
          say: Say = print) -> None:
    """Restore the code, then install the environment (or check an existing one)."""
    lock, code_ref = _frozen(store, run_id, required=python is None)
    code_dir.mkdir(parents=True, exist_ok=True)
    if code_ref:
        files = codearchive.restore(store, run_id, code_ref, code_dir)
        say(f"restored {len(files)} files of code {code_ref['archive'][:12]} into {code_dir}")
    else:
        say("the run has no code archive: the entry point must already be on this node")
    inputs_place.place(store, run_id, node_dir(), say, code_dir)  # where the script reads them
    if lock is None:
        say("the run has no frozen environment: using the interpreter as it is")
        return
    if python is None:
        # the wheelhouse where the bootstrap fetched it, completed from the store; the code
        # is in place already (restored above, with the inputs), its editables install here
        rebuilt = envrebuild.rebuild(lock, envinstall.detect_target(),
                                     envinstall.Options(venv=venv), store=store, run_id=run_id,
                                     wheelhouse_to=node_dir() / "wheelhouse",
                                     code=envrebuild.Code(code_dir), say=say)
        for problem in rebuilt.editable_failed:
            say(f"warning: {problem}")
        python = rebuilt.plan.python
        _judge(rebuilt.differences, say)
    else:
        check_environment(lock, python, say)
    _checked_marker().write_text(f"{lock.digest} {python}\n")


def _frozen(store: Store, run_id: str, required: bool):
    try:
        return freeze.load_frozen(store, run_id)
    except LockfileError:
        if required:
            raise
        return None, codearchive.latest_ref(store, run_id)


def _checked_marker() -> Path:
    return node_dir() / "environment-checked"


def _already_checked(digest: str, python: str) -> bool:
    """Setup checked this lockfile against this interpreter on this node already."""
    try:
        return _checked_marker().read_text().split() == [digest, python]
    except OSError:
        return False


def check_environment(lock, python: str, say: Say) -> None:
    """Errors (another torch major, another snapshot format) stop the node; the rest is
    reported, because a card change legitimately changes the torch build."""
    _judge(envcheck.compare(lock, envcheck.live_in(python)), say)


def _judge(differences: list[envcheck.Difference], say: Say) -> None:
    """Say the differences that matter; raise on the first that breaks the snapshots."""
    errors = [d for d in differences if d.severity == envcheck.ERROR]
    for d in differences:
        if d.severity != envcheck.NOTE:
            say(f"environment {d.severity}: {d.what} {d.recorded} -> {d.live} ({d.note})")
    if errors:
        d = errors[0]
        raise BurstError(f"this node's environment breaks the run's snapshots: {d.what} "
                         f"{d.recorded or '-'} -> {d.live or '-'} ({d.note})")
    say(f"environment checked against the lockfile: {len(differences)} difference(s), "
        "none breaking")


# -- the card and the plan ------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """What this node has: a card name (None: CPU only) and how many."""

    name: str | None
    count: int = 0


def detect_card(environ: Mapping[str, str] | None = None) -> Card:
    """``$BURST_NODE_GPU`` if set, else NVML (no CUDA context is created)."""
    environ = os.environ if environ is None else environ
    forced = (environ.get(ENV_NODE_GPU) or "").strip()
    if forced:
        if forced.lower() == "cpu":
            return Card(None)
        name, _, count = forced.partition(":")
        return Card(name, int(count or 1))
    gpu = envfacts.detect_gpu()
    return Card(gpu.name, gpu.count) if gpu else Card(None)


@dataclass(frozen=True)
class NodePlan:
    env: dict[str, str]
    summary: dict[str, object] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def plan_here(store: Store, run_id: str, card: Card, environ: Mapping[str, str] | None = None
              ) -> NodePlan:
    """The plan for this node. A GPU in the catalog is planned like any candidate; a CPU
    node (or an unknown card) keeps the snapshot's layout and precision. Either way the
    world size is the processes the task starts (``SKYPILOT_NUM_GPUS_PER_NODE`` per node),
    not the GPUs NVML sees: a box with 8 GPUs running one process plans for one."""
    environ = os.environ if environ is None else environ
    manifest = reader.read_manifest(store, run_id)
    if manifest is None:
        raise BurstError(f"run {run_id!r} has no snapshot in {store.url}")
    forced = _forced_micro(environ)
    nodes = int(environ.get("SKYPILOT_NUM_NODES") or 1)
    options = planner.Options(margin=float(environ.get(ENV_PLAN_MARGIN) or
                                           planner.DEFAULT_MARGIN),
                              amp=environ.get(ENV_PLAN_AMP) or "auto", spot="never")
    if card.name is not None:
        from burst.plan.cards import load

        if load(user_config.load()).for_device(card.name) is not None:
            return _planned(store, run_id, card, nodes, _gpus_per_node(environ), options,
                            forced)
    return _kept(manifest, card, forced, nodes, _gpus_per_node(environ))


def _planned(store: Store, run_id: str, card: Card, nodes: int, per_node: int,
             options: planner.Options, forced: int | None) -> NodePlan:
    from burst.plan.cards import load

    name = load(user_config.load()).for_device(card.name or "")
    assert name is not None
    result = replan(store, run_id, cards=[name.name], counts=[per_node],
                    nodes=nodes, options=options, config=user_config.load())
    chosen = result.choose()
    if forced is not None:
        chosen = chosen.with_micro_batch(forced)
    summary = {"card": name.name, "count": per_node, "on_node": card.count, "nodes": nodes,
               "micro_batch": chosen.micro_batch, "accumulation": chosen.accumulation,
               "amp": chosen.amp, "probe": chosen.probe}
    return NodePlan(chosen.to_env(), summary, chosen.notes)


def _gpus_per_node(environ: Mapping[str, str]) -> int:
    """The processes the task starts on each node: one per GPU SkyPilot gave it (torchrun,
    ``task-multinode.yaml.j2``), one where no launcher says (``task.yaml.j2``, SSH)."""
    raw = environ.get("SKYPILOT_NUM_GPUS_PER_NODE") or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"$SKYPILOT_NUM_GPUS_PER_NODE must be a positive integer, got {raw!r}")
    return int(raw)


def _kept(manifest: Mapping, card: Card, forced: int | None, nodes: int = 1,
          per_node: int = 1) -> NodePlan:
    """The snapshot's micro-batch and precision, over the processes this task starts
    (``nodes * per_node``, which may differ from the snapshot's world size)."""
    batch = manifest.get("batch") or {}
    global_batch, saved = int(batch["global"]), int(batch.get("world_size") or 1)
    world = nodes * per_node
    micro = forced or int(batch.get("micro") or global_batch)
    if global_batch % (micro * world):
        raise ConfigError(f"micro-batch {micro} does not split global batch {global_batch} "
                          f"over {world} process(es)")
    amp = (manifest.get("amp") or {}).get("dtype")
    what = card.name or "cpu"
    notes: tuple[str, ...] = \
        (f"{what}: not in the card catalog, layout and precision kept",) if card.name \
        else ("no GPU: layout and precision kept",)
    if world != saved:
        notes += (f"world size {saved} -> {world} ({nodes} node(s) x {per_node} process(es))",)
    accumulation = global_batch // (micro * world)
    env = PlanEnv(micro_batch=micro, accumulation=accumulation, world_size=world,
                  amp=amp or "none").to_env()
    summary = {"card": what, "count": card.count, "nodes": nodes, "world_size": world,
               "micro_batch": micro, "accumulation": accumulation, "amp": amp, "probe": False}
    return NodePlan(env, summary, notes)


def _forced_micro(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(ENV_PLAN_MICRO_BATCH)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"${ENV_PLAN_MICRO_BATCH} must be a positive integer, got {raw!r}")
    return int(raw)


# -- run ----------------------------------------------------------------------------------


def run(command: Sequence[str], run_id: str, store_url: str, *, python: str | None,
        venv: Path, local_dir: Path, say: Say = print) -> int:
    """Count this start, pull, check, re-plan, train; the exit code is burst's code for
    how training ended (86, 87, 88 from the ranks' failure records even when torchrun exits
    1; else the training process's status, 128+N for a signal), so SkyPilot's
    ``recover_on_exit_codes`` sees burst's failure codes; 89 for a start over the restart
    bound. An OOM the agent could not shrink away ends with 86, which SkyPilot does not
    recover: a new node of the same list would run out of memory the same way."""
    store = open_store(store_url)
    local = open_store(str(local_dir))
    start = restarts.claim(store, run_id, host=os.uname().nodename)
    if start is not None and start.over:
        return _refuse_restart(store, local, run_id, start, say)
    step, planned_from = fetch_snapshot(store, local, run_id, say)
    interpreter = python or str(venv / "bin" / "python")
    lock, _ = _frozen(store, run_id, required=False)
    if lock is not None and not _already_checked(lock.digest, interpreter):
        check_environment(lock, interpreter, say)
    card = detect_card()
    plan = plan_here(planned_from, run_id, card)
    for note in plan.notes:
        say(f"plan: {note}")
    say("plan: " + " ".join(f"{k}={v}" for k, v in plan.env.items()))
    _record(local, run_id, "node-start", step=step, plan=plan.summary,
            restarts=None if start is None else start.restarts,
            errors=None if start is None else start.errors,
            preemptions=None if start is None else start.preemptions, **_where())
    inputs_place.place(store, run_id, node_dir(), say)  # kept if setup's are in place
    env = {**plan.env, ENV_LOCAL: str(local_dir), "PATH": _path_with(interpreter),
           ENV_RUN_ID: run_id, ENV_STORE: store_url,
           **inputs_place.node_env(node_dir())}  # where setup placed the run's inputs
    agent = Agent(entrypoint.on_node(command, interpreter), run_id=run_id, store=local,
                  store_url=store_url,
                  policy=Policy(on_oom="retry-smaller", on_gpu_failure="stop", on_killed="stop"),
                  env=env, say=lambda msg: say(f"agent: {msg}"))
    outcome = agent.run()
    code = outcome.returncode if outcome.returncode >= 0 else 128 - outcome.returncode
    last = outcome.attempts[-1] if outcome.attempts else None
    _record(local, run_id, "node-exit", returncode=code, decision=outcome.decision,
            message=outcome.message, rank=last.rank if last else None, **_where())
    if start is not None:
        _ended(store, run_id, start, code, say)
    _publish_history(local, store, run_id, say)
    return code


def _ended(store: Store, run_id: str, start: restarts.Start, code: int, say: Say) -> None:
    """Say in the store how this start ended: the next start counts it as a preemption
    or an error by that (a start with no end counts as preempted)."""
    try:
        restarts.finish(store, run_id, start, code)
    except Exception as exc:
        say(f"could not record how this start ended: {exc}")


def fetch_snapshot(store: Store, local: Store, run_id: str, say: Say,
                   environ: Mapping[str, str] | None = None) -> tuple[int, Store]:
    """Bring the snapshot the run resumes from where its ranks read it; return its step
    and the store to plan from.

    A whole (format 1) snapshot is pulled into this node's local tier, verified, as the
    run restores from there. A sharded one (format 2, written by several ranks) is not:
    when this node starts several ranks, each reads only its own byte ranges straight from
    the store (:mod:`burst.snapshot.shards`), so pulling every shard onto one disk first
    would cost the whole state's download for nothing. One rank alone needs it all, so
    it is pulled as before."""
    environ = os.environ if environ is None else environ
    newest = reader.read_manifest(store, run_id)
    world = int(environ.get("SKYPILOT_NUM_NODES") or 1) * _gpus_per_node(environ)
    if newest is not None and reader.is_sharded(newest) and world > 1:
        say(f"sharded snapshot {run_id}@{newest['step']}: each of the {world} ranks reads "
            "its own shards from the store")
        return newest["step"], store
    transfer = sync.pull(store, local, run_id, log=say)
    say(f"pulled snapshot {run_id}@{transfer.step} ({transfer.bytes_sent} bytes fetched)")
    # the store's speed as a node sees it, for `burst plan` to time the next burst by
    _record(local, run_id, PULL_EVENT, step=transfer.step, bytes=transfer.bytes_sent,
            seconds=round(transfer.seconds, 3))
    return transfer.step, local


def _refuse_restart(store: Store, local: Store, run_id: str, start: restarts.Start,
                    say: Say) -> int:
    """Over the restart bound: train nothing, say why in the run's history, and exit with a
    code SkyPilot does not recover, so the managed job ends here."""
    history = run_status.merged_events(store, run_id, None)
    code = run_status.decisive_code(
        e.get("returncode") for e in history
        if e.get("event") == "node-exit" and e.get("task_id") == start.task_id
    ) or Exit.STOPPED
    message = (f"this managed job has restarted {start.restarts} times: {start.why}; "
               "stopping it here rather than paying for another machine (its worst "
               f"ending: {failure.EXIT_KINDS.get(code) or failure.describe_exit(code)})")
    say(message)
    _record(local, run_id, "restart-limit", restarts=start.restarts, errors=start.errors,
            preemptions=start.preemptions, bound=start.bound,
            max_preemptions=start.bounds.preemptions, code=code, record=start.number,
            message=message, **_where())
    _publish_history(local, store, run_id, say)
    return Exit.RESTART_LIMIT


def _path_with(python: str) -> str:
    """PATH with the environment's bin first, so ``python train.py`` is the run's python."""
    bin_dir = str(Path(python).parent)
    return os.pathsep.join([bin_dir, os.environ.get("PATH", "")])


def _where() -> dict[str, str]:
    """Where this node is, for ``burst status``: SkyPilot's ids when present."""
    keys = {"task_id": "SKYPILOT_TASK_ID", "node_rank": "SKYPILOT_NODE_RANK",
            "cluster_info": "SKYPILOT_CLUSTER_INFO"}
    out = {name: os.environ[env] for name, env in keys.items() if os.environ.get(env)}
    out["host"] = os.uname().nodename
    out["node_dir"] = str(node_dir())
    return out


def _record(store: Store, run_id: str, name: str, /, **fields: object) -> None:
    """Node events go to the local tier, which uploads them with the run's snapshots."""
    events.record(store, run_id, name, say=lambda m: print(f"burst: {m}"), source="node",
                  **fields)


def _publish_history(local: Store, store: Store, run_id: str, say: Say) -> None:
    try:
        sync.copy_extras(local, store, run_id)
    except Exception as exc:
        say(f"could not upload the run's history: {exc}")

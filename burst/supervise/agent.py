"""The agent: supervise a training process, and act by policy when it fails.

``burst run -- python train.py`` starts the script as a child, watches the GPUs while it
runs, and reads how it ended: from the failure records its ranks leave in a directory made
fresh for each attempt (``$BURST_FAILURE_DIR``), else from its exit status
(``burst.supervise.verdict``; torchrun turns a worker's 86 into 1, the records survive it).
Then it decides:

- ``retry-smaller`` (OOM): start the child again with a smaller micro-batch and a larger
  gradient accumulation; the global batch, and so every optimizer step's samples, stay
  the same. Up to ``max_retries`` times, dividing by ``backoff`` each time.
- ``burst``: hand the run to a launcher (``burst resume``) to continue on a bigger card.
- ``restart`` (after SIGKILL, a segfault, a GPU failure): start again unchanged from the
  newest persisted snapshot.
- ``stop``: leave it for a person, with the reason and the exact command to resume.

Two endings are the store's fault, not the training's (``burst.training.outage``), and are
not policies: a store unreachable as the run started (92: nothing trained, nothing lost) is
started again after a wait that doubles each time, counted apart from the retries above
and bounded by ``store_retries``; an upload that failed after training finished (93: the
final snapshot is in the local tier) is not trained again: the agent uploads the snapshot
itself, as ``burst push`` would, and exits 0 once it is in the store, else 93 with the
``burst push`` command that uploads it later.

Each start, exit (with the rank whose record decided it), decision and restart is an event
in the run's history. The agent's own exit code is burst's code for what happened (86 for an
OOM it could not shrink away, even when torchrun said 1), so a supervisor above it, such as
SkyPilot's ``recover_on_exit_codes``, can act on it.

With a share of the machine's GPU memory (``--gpu-memory-quota``, ``--priority``) the agent
holds a claim in the machine's registry (``burst.supervise.coordinator``): it starts the
child only when the quota fits, and when a higher-priority run needs the memory it SIGTERMs
the child (a snapshot at the next step boundary, exit 88), waits, and starts it again to
resume exactly; a pause is neither a failure nor a retry.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from burst import events
from burst.contract import (
    ENV_FAILURE_DIR,
    ENV_FAULT,
    ENV_GPU_MEMORY_QUOTA,
    ENV_LOCAL,
    ENV_MICRO_BATCH,
    ENV_RUN_ID,
    ENV_STORE,
    Exit,
    PlanEnv,
    Reason,
)
from burst.errors import ConfigError, SnapshotError, StoreError
from burst.snapshot import reader, sync
from burst.store import default_local_url, open_store
from burst.store.base import Store
from burst.supervise import verdict as verdicts
from burst.supervise.coordinator import PauseWatch, Share
from burst.supervise.gpuwatch import GpuWatch
from burst.training import failure

POLICIES = {
    Reason.OOM: ("retry-smaller", "burst", "stop"),
    Reason.GPU_FAILURE: ("burst", "restart", "stop"),
    "killed": ("restart", "stop"),
}
STORE_WAIT_CAP = 300.0  # seconds: the longest wait before starting again after a store outage


@dataclass
class Policy:
    on_oom: str = "retry-smaller"
    on_gpu_failure: str = "burst"
    on_killed: str = "stop"
    max_retries: int = 3
    backoff: int = 2
    # a store unreachable at the start (92): started again up to this often, apart from
    # max_retries (nothing was lost), waiting store_wait seconds, doubled each time
    store_retries: int = 5
    store_wait: float = 15.0

    def __post_init__(self) -> None:
        for kind, value in ((Reason.OOM, self.on_oom), (Reason.GPU_FAILURE, self.on_gpu_failure),
                            ("killed", self.on_killed)):
            if value not in POLICIES[kind]:
                raise ConfigError(f"policy for {kind} must be one of "
                                  f"{', '.join(POLICIES[kind])}, got {value!r}")
        if self.max_retries < 0 or self.backoff < 2:
            raise ConfigError("max retries must be >= 0 and the backoff factor >= 2")
        if self.store_retries < 0 or self.store_wait < 0:
            raise ConfigError("store retries and the wait before them must be >= 0")

    def store_delay(self, retry: int) -> float:
        """Seconds to wait before store retry number ``retry`` (1-based)."""
        return min(STORE_WAIT_CAP, self.store_wait * 2 ** (retry - 1))

    def action(self, kind: str) -> str:
        return {Reason.OOM: self.on_oom, Reason.GPU_FAILURE: self.on_gpu_failure,
                "killed": self.on_killed}.get(kind, "stop")


@dataclass
class Attempt:
    number: int
    micro_batch: int | None
    returncode: int  # the child's raw exit status
    kind: str
    seconds: float
    code: int = 0  # burst's code for ``kind`` (the decisive record's), else ``returncode``
    rank: int | None = None  # the rank whose failure record decided, None: the exit status
    paused: bool = False  # stopped at a boundary for a higher-priority run (coordinator)


@dataclass
class Outcome:
    """How supervision ended: burst's exit code for the last attempt, every attempt, the
    final decision."""

    returncode: int
    attempts: list[Attempt] = field(default_factory=list)
    decision: str = "finished"
    message: str = ""


Launcher = Callable[[str], int]  # run id -> exit code of `burst resume`


class Agent:
    """Runs ``command`` until it finishes or a policy says stop."""

    def __init__(self, command: list[str], *, run_id: str, store: Store, store_url: str,
                 policy: Policy | None = None, env: dict[str, str] | None = None,
                 watch: GpuWatch | None = None, launcher: Launcher | None = None,
                 fault: str | None = None, say: Callable[[str], None] = print,
                 child_stdout: TextIO | None = None, share: Share | None = None) -> None:
        if not command:
            raise ConfigError("give the training command after --, e.g. burst run -- python train.py")
        self.command, self.run_id, self.store = command, run_id, store
        self.store_url = store_url
        self.policy = policy or Policy()
        self.env = dict(env or {})
        self.watch, self.launcher, self.say = watch, launcher, say
        self.fault = fault  # injected into the first attempt only (drills)
        self.child_stdout = child_stdout  # e.g. stderr, when our stdout is for JSON
        self.micro_batch: int | None = _int_or_none(self.env.get(ENV_MICRO_BATCH))
        self.accumulation: int | None = None  # set with a smaller micro-batch
        self.share = share  # a claim on this machine's GPU memory (burst.supervise.coordinator)
        self.attempts: list[Attempt] = []  # ended so far, live (the metrics exporter reads it)
        self.starts = 0  # children started, the one running included

    def run(self) -> Outcome:
        outcome = Outcome(returncode=0, attempts=self.attempts)
        retries = outages = 0
        if self.watch is not None:
            self.watch.start()
        try:
            self._claim()
            while True:
                attempt = self._attempt(len(outcome.attempts) + 1)
                outcome.attempts.append(attempt)
                outcome.returncode = attempt.code
                if attempt.paused:  # neither a failure nor a retry: wait for the memory
                    self._pause()
                    continue
                if attempt.kind in ("ok", Reason.SIGNAL, "error", Reason.FENCED):
                    outcome.decision, outcome.message = _final(attempt)
                    return outcome
                if attempt.kind == failure.UPLOAD_FAILED:  # trained: upload, never retrain
                    outcome.decision, outcome.message, outcome.returncode = self._upload()
                    return outcome
                if attempt.kind == failure.STORE_UNREACHABLE:
                    if outages < self.policy.store_retries:
                        outages += 1
                        self._wait_for_store(outages)
                        continue
                    outcome.decision, outcome.message = "stop", self._store_gave_up(outages)
                    return outcome
                action = self.policy.action(attempt.kind)
                if action in ("retry-smaller", "restart") and retries >= self.policy.max_retries:
                    action = "stop"
                    self.say(f"giving up after {retries} retries")
                decision = self._decide(attempt, action)
                self._record("policy", kind=attempt.kind, action=decision, rank=attempt.rank,
                             micro_batch=self.micro_batch, attempt=attempt.number)
                if decision in ("retry-smaller", "restart"):
                    retries += 1
                    continue
                outcome.decision = decision
                outcome.message, handed_code = self._hand_over(decision, attempt)
                if handed_code is not None:  # the run lives on elsewhere: its exit is ours
                    outcome.returncode = handed_code
                return outcome
        finally:
            if self.share is not None:
                self.share.coordinator.release(self.run_id)
            if self.watch is not None:
                self.watch.stop()

    def _claim(self) -> None:
        """Register this run's quota and wait until the machine has room for it."""
        if self.share is None:
            return
        share = self.share
        share.coordinator.register(self.run_id, share.quota, share.priority)
        if not share.coordinator.acquire(self.run_id):
            self._record("memory-wait", quota=share.quota, priority=share.priority)
            waited = share.coordinator.wait(self.run_id, share.poll)
            self.say(f"memory free after {waited:.1f}s of waiting")

    def _pause(self) -> None:
        """The child stopped at a boundary with a snapshot so that a higher-priority run
        gets its memory: wait until there is room again, then start it (it resumes)."""
        assert self.share is not None
        self.share.coordinator.paused(self.run_id)
        self._record("paused", reason="a higher-priority run needs the memory",
                     quota=self.share.quota, priority=self.share.priority)
        waited = self.share.coordinator.wait(self.run_id, self.share.poll)
        self._record("unpaused", waited_seconds=round(waited, 3))

    def _attempt(self, number: int) -> Attempt:
        env = {**os.environ, **self.env, ENV_RUN_ID: self.run_id, ENV_STORE: self.store_url}
        # a smaller micro-batch after an OOM, and its accumulation (a node's plan says it
        # too, and Run checks it): the rest of the plan stays as the environment has it
        env.update(PlanEnv(micro_batch=self.micro_batch,
                           accumulation=self.accumulation).to_env())
        if self.share is not None:  # the child caps its allocator (burst.training.quota)
            env[ENV_GPU_MEMORY_QUOTA] = str(self.share.quota)
        if self.fault:  # a drill's fault hits the first attempt, not the recovery
            if number == 1:
                env[ENV_FAULT] = self.fault
            else:
                env.pop(ENV_FAULT, None)
        self._record("child-start", attempt=number, command=shlex.join(self.command),
                     micro_batch=self.micro_batch)
        started = time.monotonic()
        self.starts += 1
        with verdicts.record_directory() as records:
            env[ENV_FAILURE_DIR] = str(records)
            pause: list[PauseWatch | None] = []
            returncode = _run_child(self.command, env, self.child_stdout,
                                    started=lambda child: pause.append(self._watch_pause(child)))
            watch = pause[0] if pause else None
            if watch is not None:
                watch.stop()
            verdict = verdicts.judge(returncode, verdicts.read(records))
        seconds = time.monotonic() - started
        # asked to pause: stopped at a boundary (88), or by the SIGTERM itself if it came
        # before the child's run installed its handler (nothing trained yet to lose)
        paused = bool(watch is not None and watch.fired
                      and (verdict.kind == Reason.SIGNAL or returncode == -signal.SIGTERM))
        self._record("child-exit", attempt=number, returncode=returncode, kind=verdict.kind,
                     code=verdict.code, decided_by=verdict.source, rank=verdict.rank,
                     records=[_brief(r) for r in verdict.records], seconds=round(seconds, 3))
        self.say(f"attempt {number}: {verdict.describe()}")
        return Attempt(number, self.micro_batch, returncode, verdict.kind, seconds,
                       verdict.code, verdict.rank, paused)

    def _watch_pause(self, child: subprocess.Popen) -> PauseWatch | None:
        """Asked to pause: SIGTERM means snapshot at the next step boundary and exit 88."""
        if self.share is None:
            return None
        watch = PauseWatch(self.share, self.run_id, lambda: child.send_signal(signal.SIGTERM))
        watch.start()
        return watch

    def _decide(self, attempt: Attempt, action: str) -> str:
        if action != "retry-smaller":
            return action
        layout = self._layout()
        if layout is None:
            self.say("no snapshot or failure record says the batch layout: cannot shrink")
            return "stop"
        smaller = smaller_micro_batch(layout["micro"], layout["global"],
                                      layout.get("world_size", 1), self.policy.backoff)
        if smaller is None:
            self.say(f"micro-batch {layout['micro']} cannot shrink further")
            return "burst" if self.launcher else "stop"
        accumulation = layout["global"] // (smaller * layout.get("world_size", 1))
        self.say(f"OOM: retrying with micro-batch {smaller} (was {layout['micro']}), "
                 f"accumulation {accumulation}, global batch {layout['global']} unchanged")
        self.micro_batch, self.accumulation = smaller, accumulation
        return "retry-smaller"

    def _layout(self) -> dict | None:
        """The batch layout the child ran with: its failure record, else its snapshot."""
        for event in reversed(events.read(self.store, self.run_id)):
            if event.get("event") == "failure" and "global" in event:
                return {k: event[k] for k in ("global", "micro", "world_size") if k in event}
        manifest = reader.read_manifest(self.store, self.run_id)
        return manifest.get("batch") if manifest else None

    def _hand_over(self, decision: str, attempt: Attempt) -> tuple[str, int | None]:
        """What to tell the user, and the exit code of the resumed run if it was launched."""
        resume = f"burst resume {shlex.quote(self.run_id)} --store {shlex.quote(self.store_url)}"
        if decision == "burst":
            if self.launcher is None:
                return (f"{attempt.kind}: policy 'burst' but no launcher is configured; "
                        f"to continue elsewhere run: {resume}"), None
            self.say(f"{attempt.kind}: bursting: {resume}")
            code = self.launcher(self.run_id)
            return f"handed to burst resume (exit {code})", code
        return f"{attempt.kind}: stopped for a person; to continue run: {resume}", None

    def _wait_for_store(self, retry: int) -> None:
        """Nothing was trained, nothing lost: wait for the store, then start again."""
        delay = self.policy.store_delay(retry)
        self._record("policy", kind=failure.STORE_UNREACHABLE, action="restart",
                     retry=retry, of=self.policy.store_retries, wait_seconds=delay)
        self.say(f"the store did not answer as the run started; starting again in "
                 f"{delay:g}s (store retry {retry} of {self.policy.store_retries})")
        time.sleep(delay)

    def _store_gave_up(self, retries: int) -> str:
        self._record("policy", kind=failure.STORE_UNREACHABLE, action="stop", retries=retries)
        return (f"{self.store_url} could not be reached as the run started, "
                f"{retries + 1} time(s); nothing was trained or lost: start it again once "
                "the store answers")

    def _upload(self) -> tuple[str, str, int]:
        """Training finished but its final upload failed: push the local tier's newest
        snapshot to the store (what ``burst push`` does); the decision, message and code."""
        local_url = self.env.get(ENV_LOCAL) or default_local_url()
        command = (f"burst push {shlex.quote(self.run_id)} --store "
                   f"{shlex.quote(self.store_url)} --local {shlex.quote(local_url)}")
        try:
            [pushed] = sync.push(open_store(local_url), open_store(self.store_url), self.run_id)
        except (StoreError, SnapshotError, OSError) as exc:
            why = " ".join(str(exc).split()) or type(exc).__name__
            self._record(failure.UPLOAD_FAILED, message=why, by="agent")
            return (failure.UPLOAD_FAILED, f"training finished, but its snapshot is only in the "
                    f"local tier: the upload failed again ({why}); `{command}` uploads it "
                    "later", Exit.UPLOAD_FAILED)
        self._record("uploaded", step=pushed.step, by="agent")
        return ("finished", f"training finished; the agent uploaded the final snapshot "
                f"(step {pushed.step}) the run could not", 0)

    def _record(self, name: str, /, **fields: object) -> None:
        events.record(self.store, self.run_id, name, say=self.say, source="agent", **fields)


def smaller_micro_batch(micro: int, global_batch: int, world_size: int, backoff: int
                        ) -> int | None:
    """The largest micro-batch <= micro // backoff that divides the per-rank batch."""
    per_rank = global_batch // max(world_size, 1)
    target = micro // backoff
    for candidate in range(target, 0, -1):
        if per_rank % candidate == 0:
            return candidate
    return None


def _final(attempt: Attempt) -> tuple[str, str]:
    if attempt.kind == "ok":
        return "finished", "training finished"
    if attempt.kind == Reason.SIGNAL:
        return "stopped", "stopped on a signal after a snapshot"
    if attempt.kind == Reason.FENCED:
        return "fenced", "a newer launch of this run took over (its node owns the run now)"
    return "error", (f"the training script failed ({failure.describe_exit(attempt.returncode)}); "
                     "not a GPU failure, so no retry")


def _run_child(command: list[str], env: dict[str, str], stdout: TextIO | None,
               started: Callable[[subprocess.Popen], object] | None = None) -> int:
    """Run the child in the foreground; forward SIGTERM/SIGINT so it can snapshot."""
    try:
        child = subprocess.Popen(command, env=env, stdout=stdout)
    except OSError as exc:
        raise ConfigError(f"cannot start {command[0]!r}: {exc.strerror}") from None
    if started is not None:
        started(child)
    forwarded = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for signum in forwarded:
        signal.signal(signum, forward)
    try:
        return child.wait()
    finally:
        for signum, handler in forwarded.items():
            signal.signal(signum, handler)


def _brief(record: dict) -> dict:
    """A record as the exit event keeps it (no pid or time: the event has its own)."""
    return {key: record.get(key) for key in ("rank", "kind", "exit_code", "step")}


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None

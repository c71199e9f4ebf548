"""The public training-loop API: a ``Run`` that a plain PyTorch loop adopts in a few lines.

::

    run = burst.Run("my-run", global_batch=64, micro_batch=16)
    run.attach(model, optimizer, scheduler)          # restore-or-start
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
    for epoch in run.epochs(10):
        for step in run.steps(loader):               # one optimizer step each
            for x, y in step:                        # its micro-batches
                (loss_fn(model(x), y) * step.weight(len(x))).backward()
            optimizer.step(); optimizer.zero_grad(); scheduler.step()
    run.close()

The run counts what the optimizer has consumed, not what the DataLoader prefetched, and
takes snapshots only between optimizer steps. A crash inside a gradient-accumulation
window therefore loses that window and nothing else: the restored run starts again at
the window's first sample, with the state the previous optimizer step left.

The batch layout can be re-planned for another card through the environment
(``BURST_MICRO_BATCH``, ``BURST_AMP``, set by ``burst resume``); the global batch never
changes, so each optimizer step sees exactly the same samples.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from burst.contract import ENV_RUN_ID, Reason
from burst.env import freeze
from burst.errors import ConfigError, SnapshotError
from burst.inputs import part as inputs_part
from burst.parallel.group import Group, unwrap
from burst.snapshot import lineage
from burst.snapshot.upload import UploadQueue
from burst.state import capture as state_mod
from burst.state.amp import parse_amp
from burst.state.rng import derive_seed
from burst.store import Store, default_local_url, is_local, open_store
from burst.store.base import SHARED_PREFIXES, check_key
from burst.training import (
    adaptive,
    attach_guard,
    batches,
    failure,
    faults,
    fencing,
    memory_control,
    outage,
    preemption,
)
from burst.training import command as launch
from burst.training import quota as memory_quota
from burst.training.boundary import BoundaryCopies
from burst.training.forward import Forward
from burst.training.guard import DEFAULT_GRACE_SECONDS, Guard
from burst.training.history import History
from burst.training.layout import Layout, planned_amp
from burst.training.memory import MemoryManager
from burst.training.progress import Progress
from burst.training.rescue import Rescue
from burst.training.restorer import Restorer
from burst.training.sampler import ResumableSampler
from burst.training.sidecar import Sidecar
from burst.training.snapshotter import Snapshotter, interval_policy
from burst.training.step import Step, hand_out
from burst.training.subject import Subject
from burst.training.trackers import Trackers


class Run:
    """One training run: its identity, its batch layout, its snapshots.

    A façade: each job is a part's, and the run wires them to the loop. ``progress``
    (steps, epochs, samples, the step's phase), ``subject`` (the objects it trains, their
    batch ``Layout`` as ``plan`` and precision), the snapshotter (cadence, votes, capture,
    upload), the restorer (choose, pull, load), the boundary copies an OOM rewinds to,
    the memory re-plan, the sidecar (metrics, live figures, pre-staging), and ``rescue``,
    which the failure guard talks to (``guard.GuardedRun``: the boundary state, the RAM
    shadow, the flush). ``run.step``, ``run.micro_batch`` and the like read the part.

    ``attach``, ``epochs``, ``steps``, ``snapshot``, ``log`` and ``close`` are all a plain
    loop needs; a loop without a DataLoader uses ``batches`` (burst calls its batch
    function), and ``attach(carry=...)`` holds what a loop carries from step to step. A
    random draw between two steps is warned about once. A loop burst does not own
    (Lightning's, Accelerate's: ``burst.integrations``) hands out the micro-batches itself
    and calls, for each optimizer step, ``begin_step()``, ``before_micro_batch(index)``
    before each micro-batch, then ``end_step(samples)`` once ``optimizer_stepped`` (else
    ``abandon_step()``), after ``adopt_sampler(sampler)`` once; ``recover(exc)`` turns a
    CUDA OOM or GPU failure it caught into the emergency snapshot and an exit code.

    ``inputs``: the files, folders or ``s3://``/``oss://``/``gs://`` URLs the run reads,
    shipped to the store for a node with what the process is seen reading
    (``burst.inputs``). ``trackers``: TensorBoard, W&B and MLflow runs that continue
    after a resume (``burst.training.trackers``); add them after ``attach``.

    Intervals left out (``shadow_every``, ``persist_every``, ``persist_seconds``) are
    chosen from measured costs within ``overhead_budget`` of the training time
    (``burst.training.adaptive``; ``persist_every`` alone: no timed persists,
    ``persist_seconds=None``: none); ``intervals()`` says what is in force. Memory (one
    process only, ``burst.training.memory_control``): past ``memory_target`` of the card
    (read by ``memory_reader``) or after ``memory_alert()`` the next step runs a smaller
    micro-batch (``steps`` splits the loader's batches), growing back with lasting
    headroom; ``memory_rules`` (``"memory > 80%: amp=bf16"``) apply once past their
    threshold.
    """

    # where the run stands (``burst.training.progress``), read and set as run.step etc.
    step: Forward[int] = Forward("progress")
    epoch: Forward[int] = Forward("progress")
    samples_consumed: Forward[int] = Forward("progress")
    samples_in_epoch: Forward[int] = Forward("progress")
    total_epochs: Forward[int | None] = Forward("progress")
    steps_per_epoch: Forward[int | None] = Forward("progress")
    # what it trains (``burst.training.subject``): the layout and precision in force too
    plan: Forward[Layout] = Forward("subject")  # re-planned whole, never edited
    amp: Forward[str | None] = Forward("subject")  # a memory rule may change it
    components: Forward[state_mod.Components] = Forward("subject")
    extra: Forward[dict[str, Any]] = Forward("subject")  # the user's, kept in snapshots
    trackers: Forward[Trackers] = Forward("subject")  # experiment curves that continue
    # the batch layout in force (``burst.training.layout``)
    global_batch: Forward[int] = Forward("plan")
    micro_batch: Forward[int] = Forward("plan")
    accumulation: Forward[int] = Forward("plan")
    world_size: Forward[int] = Forward("plan")
    rank: Forward[int] = Forward("plan")
    planned_micro: Forward[int] = Forward("plan")  # the loader's batch; never grown past
    # for a foreign loop: has ``optimizer.step()`` run in the step in progress?
    optimizer_stepped: Forward[bool] = Forward("progress", "stepped")
    # calls a part answers whole (the run adds nothing to them)
    recover: Forward[Callable[[BaseException], int]] = Forward("_guard")
    """After a CUDA OOM or GPU failure (``failure.classify(exc)`` is not None) caught by a
    framework: save what can be trusted, leave the failure record, and return the exit
    code to leave with."""
    intervals: Forward[Callable[[], adaptive.Intervals]] = Forward("_snapshots")
    """The shadow and persist intervals in force (the user's, or chosen from measured
    costs), with the work a SIGKILL would lose on average."""
    grad_scaler: Forward[Callable[[], torch.amp.GradScaler]] = Forward("subject")
    """A GradScaler that is enabled exactly when the run's precision needs one (fp16)."""
    memory_alert: Forward[Callable[[], None]] = Forward("_memory", "alert")
    """A memory alert fired (callable from any thread): the next step boundary shrinks
    the micro-batch (when this run re-plans memory at all)."""

    def __init__(
        self,
        run_id: str | None = None,
        *,
        global_batch: int,
        micro_batch: int | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        local: str | os.PathLike[str] | None = None,
        amp: str | None = None,
        seed: int = 0,
        shadow_every: int | None = None,
        persist_every: int | None = None,
        persist_seconds: float | str | None = adaptive.AUTO,
        keep: int = 3,
        world_size: int | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        max_lost_seconds: float | None = None,
        overhead_budget: float = adaptive.DEFAULT_BUDGET,
        clock: Callable[[], float] = time.monotonic,
        memory_target: float | None = memory_control.DEFAULT_TARGET,
        memory_reader: memory_control.Reader | None = None,
        memory_rules: tuple[str, ...] | list[str] = (),
        inputs: tuple[str | os.PathLike[str], ...] | list[str | os.PathLike[str]] = (),
    ) -> None:
        self.run_id = _run_id(run_id)
        # world_size=None: whatever torch.distributed runs (burst.parallel.init_from_env)
        group = self._group = Group.for_run(world_size)
        self.subject = Subject(Layout.plan(global_batch, micro_batch, group.rank,
                                           group.world_size),  # checked against the plan
                               parse_amp(planned_amp(amp)))
        self.seed = seed
        self.progress = Progress()
        self.memory_quota = memory_quota.apply()  # burst run --gpu-memory-quota: cap CUDA
        # the stores last: every setting above is checked before any upload thread starts
        self.store = open_store(store)
        # this launch's generation, taken before any upload or restore (snapshot.lineage)
        self.lineage = outage.at_start(self.store, self.run_id, lambda: lineage.take(
            self.store, self.run_id), group)
        self.local, uploads = _local_tier(self.store, self.run_id, local,
                                          uploads=self.rank == 0)
        # intervals left out are chosen from measured costs (burst.training.adaptive)
        policy = interval_policy(shadow_every, persist_every, persist_seconds, overhead_budget,
                                 clock)
        self.restored: state_mod.RestoreReport | None = None
        self.record_event = History(self.local, self.run_id, self.rank, group.is_writer)
        self._sidecar = Sidecar(self.store, self.local, self.run_id, self.rank,
                                group.is_writer, self.record_event)
        stop_fenced = lambda: fencing.stop(self.rescue, self.lineage)  # noqa: E731
        self._snapshots = Snapshotter(
            self.store, self.local, uploads, self.run_id, group, self.lineage,
            keep=keep, policy=policy, persist_every=persist_every,
            describe=lambda reason: self.rescue.describe(reason, frozen=False),
            take_state=lambda: self.rescue.take_state(), committed=self._sidecar.committed,
            record=self.record_event, stop_fenced=stop_fenced)
        self._restorer = Restorer(self.store, self.local, self.run_id, group, self.lineage,
                                  uploads, self.record_event, stop_fenced)
        self._boundary = BoundaryCopies()  # what an OOM mid-step rewinds to
        self._outside = batches.OutsideDraws()  # draws between steps: said once
        self._injector = faults.for_run(self.local, self.store, self.run_id, self.record_event,
                                        settle=lambda: self.flush(timeout=60))
        # on a cloud node: the preemption notice, and the spot bound on lost work
        self.max_lost_seconds = max_lost_seconds
        self._memory = MemoryManager(self.plan, memory_target, memory_rules, memory_reader,
                                     self.record_event)
        self.rescue: Rescue = Rescue(self.subject, self.progress, group, self._boundary,
                                     self._snapshots, self._sidecar, self._memory,
                                     self._restorer.announce, self.record_event,
                                     grace_seconds)
        self._guard = Guard(self.rescue, grace_seconds)
        # the data it reads travels with it (burst.inputs): declared, and recorded from now
        # on; last, so a refused setting above leaves no audit hook recording
        self.inputs = inputs_part.declare(
            self.store, self.run_id, inputs, code_dir=freeze.default_code_dir(),
            environment=_disk_roots(self.store, self.local)) if self.rank == 0 else None

    # -- set-up -------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
               scheduler: Any | None = None, scaler: Any | None = None, *,
               sampler: ResumableSampler | None = None,
               carry: dict[str, Any] | None = None) -> state_mod.RestoreReport | None:
        """Register what to snapshot and restore the newest complete snapshot, if any.

        What the snapshot constrains is checked before anything is restored or recorded:
        the global batch, and with ``sampler`` (the loader's ``ResumableSampler``, adopted
        here) the data (length, seed, shuffle, drop_last), the position in its epoch, and
        that the ranks can split its last step. Without ``sampler`` the data is checked
        when the loop hands it over (``steps``/``adopt_sampler``), and the ``resume``
        event waits until then (or the first step or snapshot), so a refused resume is
        never in the run's history, though the objects passed here were restored.

        ``carry``: the values the loop carries from step to step (an LSTM's hidden state,
        an EMA outside the model), kept as ``run.carry``: each snapshot holds the dict as
        it is at the step boundary, and a resume puts the saved values back into it
        (``burst.state.carry``); keep it current (``run.carry["hidden"] = hidden``). One
        process only. A refused attach (an exception out of here) undoes what it
        installed: handlers, threads, hooks (``burst.training.attach_guard``).
        """
        with attach_guard.Rollback() as undo:
            self.subject.hold(model, optimizer, scheduler, scaler, carry)
            if self._boundary.track(unwrap(model)):
                undo.push(self._boundary.unhook)
            if optimizer is not None:
                for remove in self.progress.follow(optimizer):
                    undo.push(remove)
                if self._injector.pending:  # drills only: a run without them pays nothing
                    undo.push(optimizer.register_step_pre_hook(
                        lambda *_: self._injector.in_optimizer_step(self.step + 1)).remove)
            if self.memory_quota is not None:
                self.record_event("memory-quota", **self.memory_quota)
            if not self._guard.installed:
                self._guard.install()
                undo.push(self._guard.uninstall)
            if self._snapshots.watcher is None:
                self._snapshots.watcher = preemption.start(self, self.max_lost_seconds)
                if self._snapshots.watcher is not None:
                    undo.push(self._snapshots.stop_watcher)
            manifest = self._restorer.choose()
            if manifest is not None:  # checked (global batch, data) before anything changes
                self.restored = self._restorer.resume(manifest, self.subject, self.progress,
                                                      self.seed, sampler)
                if self._restorer.first_step is not None:  # its hook on the optimizer
                    undo.push(self._restorer.first_step.cancel)
            if sampler is not None:
                self.adopt_sampler(sampler)  # records the resume
            if manifest is None:
                self.record_event("start", **self.subject.layout(), **launch.fields())
            self._sidecar.start()
            self._outside.mark("attach()")
            return None if manifest is None else self.restored

    # -- the loop -----------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """Epoch numbers from the restored one up to ``count`` (exclusive)."""
        self.total_epochs = count
        while self.epoch < count:
            yield self.epoch
            self.progress.next_epoch()

    def steps(self, loader: DataLoader) -> Iterator[Step]:
        """The optimizer steps of the current epoch, from the next unconsumed sample."""
        sampler = self.adopt_sampler(self.plan.check_loader(loader))
        sampler.set_epoch(self.epoch, start=self.samples_in_epoch)
        self.steps_per_epoch = self.plan.epoch_steps(sampler.epoch_length(), loader.drop_last)
        # DataLoader draws worker seeds from this generator, not from the global RNG, so
        # starting an iterator mid-epoch after a resume does not shift the training RNG.
        loader.generator = torch.Generator().manual_seed(derive_seed("loader", self.seed,
                                                                     self.epoch, bits=63))
        batches = iter(loader)
        self._memory.rechunking = True
        for samples, share in self.plan.step_sizes(sampler.remaining(), loader.drop_last):
            micro_batches, source = self._memory.micro_batches(self.plan, share, batches)
            self.begin_step()
            injector = self._injector if self._injector.pending else None  # drills only
            current = Step(self.step + 1, self.epoch, samples, micro_batches, source,
                           injector, self.world_size)
            yield from hand_out(current, lambda n=samples: self.end_step(n), self.abandon_step,
                                lambda: self.progress.stepped)

    def batches(self, source: Callable[..., Any], *, over: Any = None,
                steps: int | None = None, prefetch: int = 1) -> Iterator[Step]:
        """Optimizer steps of micro-batches that burst draws from ``source``, for a loop
        without a DataLoader: ``for step in run.batches(lambda: get_batch("train"),
        steps=max_iters)``, each ``step`` iterated for its ``accumulation`` micro-batches.

        ``source()`` draws one micro-batch (``run.micro_batch`` samples); its random draws
        come from a stream of its own, so it never moves the generators the model uses,
        and the snapshot keeps that stream's place. ``over``: keys to draw in order, one
        per micro-batch (``source(key)``; the bptt offsets of a token stream): the steps
        of the current epoch, from the next key not yet consumed. ``steps``: the run's
        total of optimizer steps (None: no end). ``prefetch``: micro-batches drawn ahead,
        across step boundaries too; a resumed run draws them again, the same
        (``burst.training.batches``). One process only."""
        return batches.steps(self, source, over=over, steps=steps, prefetch=prefetch)

    @property
    def carry(self) -> dict[str, Any] | None:
        """The dict given as ``attach(carry=...)``, with a resumed run's values in it."""
        return self.components.loop.carry if self.components.loop else None

    # -- hooks for loops burst does not own (Run.steps uses them too) -------------------

    def adopt_sampler(self, sampler: object) -> ResumableSampler:
        """Make ``sampler`` the run's: check it is a ``ResumableSampler`` over the data the
        snapshot was taken on, and give it the run's layout (global batch, rank, world)."""
        adopted = self.subject.adopt(sampler)
        self._restorer.announce()
        return adopted

    def begin_step(self) -> None:
        """An optimizer step starts: remember the boundary state an OOM falls back to."""
        self._restorer.announce()
        outside = self._outside.check(self.step + 1)  # drawn since the last boundary?
        if outside is not None:
            self.record_event(batches.OUTSIDE_EVENT, step=self.step, message=outside)
        self._snapshots.step_started()
        # the RNGs and buffers as they were: only CUDA errors (or a drill) rewind to them
        self._boundary.mark(self.components.model,
                            torch.cuda.is_initialized() or bool(self._injector.pending))
        self.progress.begin_step()

    def before_micro_batch(self, index: int) -> None:
        """Micro-batch ``index`` (0-based) of the step in progress is about to run; a
        ``BURST_FAULT`` drill set for it fires here."""
        self._injector.before_micro_batch(self.step + 1, index)

    def end_step(self, samples: int) -> None:
        """The step in progress consumed ``samples`` (on all ranks) and stepped the
        optimizer: count it; this may snapshot, and after a signal stops the process."""
        self.progress.end_step()
        self._snapshots.step_ended()
        self.progress.count(samples)
        if torch.cuda.is_initialized():  # a flag, never initialising CUDA
            self._memory.record_peak(self.micro_batch)
        self.plan, self.amp = self._memory.at_boundary(self.plan, self.amp,
                                                       self.components.model, self.step)
        self._sidecar.step_done(self.step, samples, self.plan, self._snapshots.uploads)
        self._snapshots.boundary(self.step, self._guard)  # may snapshot, may stop
        self._outside.mark(f"step {self.step}")

    def abandon_step(self) -> None:
        """The step in progress ends without being counted (it never stepped the
        optimizer); its samples will be drawn again."""
        self.progress.end_step()
        self._outside.mark(f"step {self.step}")

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self, reason: str = Reason.MANUAL, wait: bool = False) -> None:
        """Snapshot now if between steps, else at the end of the current step.

        On several ranks a snapshot between steps is a collective: call it on every rank
        (a request made during a step, on any rank, is agreed on at the step's end)."""
        if self.progress.in_step:
            self._snapshots.requested = reason
            return
        self._snapshots.capture(self.step, reason, persist=True)
        if wait:
            self._group.settle(self.flush)

    def request_snapshot(self, reason: str = Reason.PREEMPTION) -> None:
        """From any thread: at the next step boundary persist a snapshot under ``reason``
        and wait there (up to ``grace_seconds``) until it is stored, then train on. It
        only sets a flag, like a signal: what a watcher thread calls (the preemption
        notice, ``burst.training.preemption``) without ever touching training state."""
        self._guard.request_snapshot(reason)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued snapshot is in the store (uploaded, for a remote one);
        raise if one failed or ``timeout`` seconds pass."""
        self._snapshots.flush(timeout)

    def log(self, **values: float) -> None:
        """Record metrics of the step just finished (``run.log(loss=loss)``) for
        ``burst report``; buffered, written with the next snapshot (rank 0 only)."""
        step = self.step + 1 if self.progress.in_step else self.step  # not yet counted
        self._sidecar.logged(step, self.samples_consumed, values)

    def close(self) -> None:
        """Snapshot the final state and wait for it to be stored."""
        self._sidecar.stop_staging()  # returns at once: never holds up the final snapshot
        upload_error = self._snapshots.store_final(self.step)
        self._sidecar.metrics.flush()
        self.record_event("finish", step=self.step)
        self.trackers.close()
        self._guard.uninstall()
        self._boundary.unhook()
        if self._snapshots.watcher is not None:
            self._snapshots.watcher.stop()
        inputs_part.release(self.store, self.run_id)  # a later run here records afresh
        if upload_error is not None:
            outage.upload_failed(self.local, self.store, self.run_id, self.step, upload_error)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, _tb: object) -> None:
        if exc is None:
            self.close()
            return
        if failure.classify(exc) is not None:
            code = self.recover(exc)
            raise SystemExit(code) from None
        with contextlib.suppress(Exception):
            self.flush()

    def autocast(self, device_type: str | None = None) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the run's precision (a no-op in full precision)."""
        return self.subject.autocast(device_type)


def _disk_roots(*stores: Store) -> list[str]:
    """Stores on this machine's disk: what the run reads there is burst's, not input."""
    roots = [getattr(store, "root", None) for store in stores]
    return [os.fspath(root) for root in roots if isinstance(root, str | os.PathLike)]


def _run_id(run_id: str | None) -> str:
    run_id = run_id or os.environ.get(ENV_RUN_ID)
    if not run_id:
        raise ConfigError(f"give the run an id: Run('name') or ${ENV_RUN_ID}")
    try:
        check_key(run_id)
    except SnapshotError:
        raise ConfigError(f"run id {run_id!r} may hold only letters, digits and ._=+@-") from None
    if run_id in SHARED_PREFIXES:
        raise ConfigError(f"run id {run_id!r} is a name the store keeps for itself "
                          f"({', '.join(sorted(SHARED_PREFIXES))}): "
                          "choose another")
    return run_id


def _local_tier(store: Store, run_id: str, local: str | os.PathLike[str] | None,
                uploads: bool = True) -> tuple[Store, UploadQueue | None]:
    """A remote store gets a local tier in front: snapshots commit to disk first (fast,
    crash-safe) and upload in the background, so the loop never waits on the network.
    Only the writing rank uploads; the others read through the tier."""
    if is_local(store):
        return store, None
    tier = open_store(local or default_local_url())
    if not is_local(tier):
        raise ConfigError(f"local= must be a directory on this machine, got {tier.url}")
    if not uploads:
        return tier, None
    queue = UploadQueue(tier, store, run_id)
    queue.catch_up()  # a snapshot a crash left un-uploaded goes up now
    return tier, queue

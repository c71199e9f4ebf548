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
import math
import os
import platform
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import torch
from torch.nn.modules.module import register_module_buffer_registration_hook
from torch.utils.data import DataLoader

from burst import events
from burst.contract import ENV_RUN_ID, Reason
from burst.env import freeze, stager
from burst.errors import ConfigError, SnapshotError, StoreError
from burst.inputs import part as inputs_part
from burst.parallel import fallback
from burst.parallel import state as dist_state
from burst.parallel.group import Group, StepVote, unwrap
from burst.snapshot import lineage, reader, restorable, sync
from burst.snapshot import tiers as snapshot
from burst.snapshot.tensors import load_tensors
from burst.snapshot.tiers import Captured  # in the class body `snapshot` is Run.snapshot
from burst.snapshot.upload import UploadQueue
from burst.state import capture as state_mod
from burst.state import rng
from burst.state.amp import AMP_DTYPES, parse_amp
from burst.state.carry import LoopState
from burst.state.rng import derive_seed
from burst.store import Store, default_local_url, is_local, open_store
from burst.store.base import SHARED_PREFIXES, check_key
from burst.training import (
    adaptive,
    attach_guard,
    batches,
    checkpointing,
    failure,
    faults,
    fencing,
    memory_control,
    outage,
    preemption,
)
from burst.training import command as launch
from burst.training import quota as memory_quota
from burst.training.forward import Forward
from burst.training.guard import DEFAULT_GRACE_SECONDS, Guard
from burst.training.layout import Layout, planned_amp, positive
from burst.training.metrics import LiveFigures, MetricBuffer
from burst.training.progress import Progress
from burst.training.sampler import ResumableSampler
from burst.training.step import Step, hand_out
from burst.training.trackers import STATE_KEY as TRACKERS_KEY
from burst.training.trackers import Trackers

UTC = timezone.utc  # datetime.UTC is Python 3.11+; nodes may run 3.10

# the persist interval of a run whose code leaves it to burst: an operator or a drill sets
# the cadence without editing the script (a value the code gives always wins)
ENV_PERSIST_SECONDS = "BURST_PERSIST_SECONDS"
INTERVALS_EVENT = "snapshot-intervals"  # the intervals chosen from measured costs
# How long rank 0 waits for the other ranks' pieces of a sharded snapshot after its own
# is stored: they write the same share of bytes at the same time, so far more than a
# piece's upload; a rank that never reports (dead, hung) fails that snapshot, not the run.
SHARD_TIMEOUT_SECONDS = 600.0
# snapshots that may wait for the freeze
_ROUTINE_REASONS = (Reason.PERIODIC, Reason.MANUAL, Reason.FINAL)


class Run:
    """One training run: its identity, its batch layout, its snapshots.

    ``attach``, ``epochs``, ``steps``, ``snapshot``, ``log`` and ``close`` are all a plain
    loop needs; a loop without a DataLoader uses ``batches`` instead of ``steps`` (burst
    calls its batch function), and ``attach(carry=...)`` holds what a loop carries from
    step to step (``burst.training.batches``, ``burst.state.carry``). A random draw
    between two steps is warned about once. A loop that burst does not own (Lightning's, Accelerate's: see
    ``burst.integrations``) hands out the micro-batches itself and drives the run
    through these hooks instead of ``steps``, in this order for each optimizer step:

    - ``adopt_sampler(sampler)``: once, after ``attach``: the loader's
      ``ResumableSampler`` gets the run's layout and is checked against the snapshot's data;
    - ``begin_step()`` before the step's first micro-batch (remembers the boundary an OOM
      falls back to), ``before_micro_batch(index)`` before each (``BURST_FAULT`` drills);
    - ``optimizer_stepped`` (read-only) turns True once ``optimizer.step()`` has run;
    - ``end_step(samples)`` counts the finished step (and may snapshot, or stop the
      process after a signal); ``abandon_step()`` drops a step that never reached the
      optimizer, as at the end of an epoch;
    - ``recover(exc)`` turns a CUDA OOM or GPU failure caught by the framework into the
      emergency snapshot and returns the exit code to leave with.

    ``inputs``: files, folders or ``s3://``/``oss://``/``gs://`` URLs the run reads (its
    data set); burst also records what the process reads outside the project and the
    environment, and ships both to the store for a node (``burst.inputs``; on a node,
    ``burst.input_path(path)`` says where an input was placed).

    ``trackers`` (:mod:`burst.training.trackers`): TensorBoard, W&B and MLflow runs that
    continue after a resume, their state kept in each snapshot; add them after ``attach``.

    ``in_optimizer_step``, ``layout``, ``save_boundary``, ``persist_shadow`` and
    ``record_event`` are what the failure guard asks of a run (``guard.GuardedRun``).

    How often to snapshot: left out, ``shadow_every`` (steps between RAM copies) and the
    persist interval are chosen from measured costs so that burst takes at most
    ``overhead_budget`` of the training time (1%) while a kill loses as little as it can;
    the first persist comes after ten seconds of training (``burst.training.adaptive``).
    ``shadow_every``, ``persist_every`` or ``persist_seconds`` given are used as given
    (``persist_every`` alone: no timed persists; ``persist_seconds=None``: none at all).
    ``intervals()`` says what is in force; each snapshot's meta records it.

    Memory (``burst.training.memory_control``, one process only): after each step
    ``memory_reader`` (default: the CUDA allocator's peak; nothing on CPU) reads the card;
    past ``memory_target`` (85%; None: off) or after ``memory_alert()`` the next step runs a
    smaller micro-batch and more accumulation, and with lasting headroom grows back, never
    past the planned one. ``run.steps`` splits the loader's batches (``batch_size`` stays
    the planned micro-batch), so every step keeps its samples. ``memory_rules`` such as
    ``"memory > 80%: amp=bf16"`` or ``"memory > 90%: activation_checkpointing=Block"``
    apply once, at the first boundary past their threshold.
    """

    # where the run stands (``burst.training.progress``), read and set as run.step etc.
    step: Forward[int] = Forward("progress")
    epoch: Forward[int] = Forward("progress")
    samples_consumed: Forward[int] = Forward("progress")
    samples_in_epoch: Forward[int] = Forward("progress")
    total_epochs: Forward[int | None] = Forward("progress")
    steps_per_epoch: Forward[int | None] = Forward("progress")
    # the batch layout in force (``burst.training.layout``): re-planned whole, never edited
    global_batch: Forward[int] = Forward("plan")
    micro_batch: Forward[int] = Forward("plan")
    accumulation: Forward[int] = Forward("plan")
    world_size: Forward[int] = Forward("plan")
    rank: Forward[int] = Forward("plan")
    planned_micro: Forward[int] = Forward("plan")  # the loader's batch; never grown past

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
        self._group = Group.for_run(world_size)
        self.plan = Layout.plan(global_batch, micro_batch, self._group.rank,
                                self._group.world_size)  # checked against the launch's plan
        self.seed = seed
        self.amp = parse_amp(planned_amp(amp))  # the precision in force (a rule may change it)
        self.progress = Progress()
        self.memory_quota = memory_quota.apply()  # burst run --gpu-memory-quota: cap CUDA
        # the stores last: every setting above is checked before any upload thread starts
        self.store = open_store(store)
        # this launch's generation, taken before any upload or restore (snapshot.lineage)
        self.lineage = outage.at_start(self.store, self.run_id, lambda: lineage.take(
            self.store, self.run_id)) if self.rank == 0 else None
        self.local, self._uploads = _local_tier(self.store, self.run_id, local,
                                                uploads=self.rank == 0)
        # intervals left out are chosen from measured costs (burst.training.adaptive)
        self.shadow_every = None if shadow_every is None else positive(shadow_every,
                                                                       "shadow_every")
        self.persist_every = None if persist_every is None else positive(persist_every,
                                                                         "persist_every")
        if persist_seconds == adaptive.AUTO and persist_every is None \
                and os.environ.get(ENV_PERSIST_SECONDS):
            persist_seconds = _seconds_from_env(os.environ[ENV_PERSIST_SECONDS])
        self.persist_seconds = _persist_seconds(persist_seconds)
        self._adaptive = adaptive.Adaptive(
            _budget(overhead_budget), shadow_every=self.shadow_every,
            persist_seconds=None if isinstance(self.persist_seconds, str) else self.persist_seconds,
            persist_chosen=self.persist_seconds == adaptive.AUTO and persist_every is None,
            clock=clock)  # what steps and copies are timed with (tests inject one)
        self._intervals_said: adaptive.Intervals | None = None  # the last one recorded
        self._step_ended: float | None = None  # clock time the previous step ended
        self._burst_seconds = 0.0  # burst's own work since then (not the step's)
        self._writes_seen = 0
        self.extra: dict[str, Any] = {}
        self.trackers = Trackers()  # experiment trackers that continue the run's curves
        self.components = state_mod.Components(loop=LoopState())
        self.restored: state_mod.RestoreReport | None = None
        self._verified_step: int | None = None  # the snapshot whose blobs this rank hashed
        self._tiers = snapshot.Tiers(self.local, self.run_id, keep=keep,
                                     on_commit=self._on_commit,
                                     complete_meta=self._freeze_fields,
                                     stamp=self.lineage.stamp() if self.lineage else None)
        if self._group.collective:  # every rank writes its own piece (burst.snapshot.parts)
            launch = self._group.broadcast_json(uuid.uuid4().hex if self.rank == 0 else None)
            self._tiers.shard_into(self.store, self.rank, self.world_size,
                                   timeout=SHARD_TIMEOUT_SECONDS, launch=launch)
        self._sampler: ResumableSampler | None = None
        self._saved_sampler: dict | None = None
        self._pending_resume: dict[str, Any] | None = None  # recorded once the data checks out
        self._boundary_rng: dict | None = None
        self._rng_boundary = rng.Boundary()  # cheap per-step captures of the generators
        self._outside = batches.OutsideDraws()  # draws between steps: said once
        self._boundary_buffers: dict[str, torch.Tensor] = {}  # preallocated copies
        self._live_buffers: list[tuple[str, torch.Tensor]] = []  # what they copy
        self._buffers_moved = True  # a buffer was (re)assigned: find them again
        self._buffer_hook: Any = None
        self._saved_buffer_names: frozenset[str] = frozenset()  # persistent ones only
        self._injector = faults.Injector.from_env()
        self._injector.settle = lambda: self.flush(timeout=60)
        self._injector.on_fire = self._record_fault
        self._injector.forget_fired(self._fired_faults())  # one-shot per run, not per process
        self._guard = Guard(self, grace_seconds)
        # on a cloud node: the preemption notice, and the spot bound on lost work
        self.max_lost_seconds = max_lost_seconds
        self._watcher: preemption.Watcher | None = None
        self._requested: str | None = None
        self._vote = StepVote(self._group)  # the ranks' per-step decision, without a stall
        self._asked: str | None = None  # a request voted on, served at the next boundary
        self._peak_memory: dict[str, int] = {}
        self._memory = self._memory_controller(memory_target, memory_rules)
        self._memory_reader = memory_reader or memory_control.cuda_reader
        self._rechunking = False  # run.steps() owns the micro-batches: it may re-plan them
        self._live = LiveFigures(self.run_id)  # for the agent's exporter, if it asked
        self._stager: stager.Stager | None = None  # pre-staging (burst.env.stager)
        self._publishing = self._group.is_writer and self._live.enabled  # asked once
        self._metrics = MetricBuffer(lambda points: self.record_event(MetricBuffer.EVENT,
                                                                points=points))
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

        Everything the snapshot constrains is checked before anything is restored or
        recorded: the global batch, and with ``sampler`` (the training loader's
        ``ResumableSampler``, adopted here) the data (length, seed, shuffle, drop_last),
        that the position fits in its epoch, and that the ranks can split the epoch's
        last step. Without ``sampler`` the data is checked when the loop hands it over
        (``steps``/``adopt_sampler``); the ``resume`` event waits until then (or until the
        first step or snapshot of a loop without one), so a refused resume is never in
        the run's history, though the objects passed here have been restored in memory.

        ``carry``: the values the loop carries from step to step (an LSTM's hidden state,
        an EMA kept outside the model, a curriculum level), kept as ``run.carry``: every
        snapshot holds what the dict holds at the step boundary, and a resume puts the
        saved values back into it (``burst.state.carry``). Keep it current:
        ``run.carry["hidden"] = hidden`` at the end of each step. One process only.

        A refused attach (an exception out of here) undoes what it installed: signal
        handlers, excepthook, threads, hooks (``burst.training.attach_guard``).
        """
        with attach_guard.Rollback() as undo:
            return self._attach(undo, model, optimizer, scheduler, scaler, sampler=sampler,
                                carry=carry)

    def _attach(self, undo: attach_guard.Rollback, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None, scheduler: Any, scaler: Any, *,
                sampler: ResumableSampler | None,
                carry: dict[str, Any] | None) -> state_mod.RestoreReport | None:
        loop = self.components.loop or LoopState()
        if carry is not None:
            if self.world_size > 1:
                raise ConfigError("carry= holds one process's values; on several ranks "
                                  "each rank's would need saving, which burst does not yet")
            loop.hold(carry)
        self.components = state_mod.Components(unwrap(model), optimizer, scheduler, scaler,
                                                loop=loop)
        self._saved_buffer_names = frozenset(unwrap(model).state_dict().keys())
        self._buffers_moved = True
        if self._buffer_hook is None:
            self._buffer_hook = register_module_buffer_registration_hook(self._buffer_assigned)
            undo.push(self._unhook_buffers)
        if optimizer is not None:
            undo.push(optimizer.register_step_pre_hook(self._before_optimizer_step).remove)
            undo.push(optimizer.register_step_post_hook(
                lambda *_: self.progress.optimizer_done()).remove)
        if self.memory_quota is not None:
            self.record_event("memory-quota", **self.memory_quota)
        if not self._guard.installed:
            self._guard.install()
            undo.push(self._guard.uninstall)
        if self._watcher is None:
            self._watcher = preemption.start(self, self.max_lost_seconds)
            if self._watcher is not None:
                undo.push(self._stop_watcher)
        manifest = dist_state.newest_manifest(  # rank 0 chooses; every rank reads that one
            self._group, self._newest_manifest,
            lambda step: reader.read_manifest(self.store, self.run_id, step))
        if manifest is None:
            if sampler is not None:
                self.adopt_sampler(sampler)
            self.record_event("start", **self.layout(), **launch.fields())
            self._start_background()
            self._outside.mark("attach()")
            return None
        self.plan.check_snapshot(manifest, sampler)  # before any state changes or event
        self.restored = self._restore(manifest)
        self._pending_resume = {"step": self.restored.step, "notes": self.restored.notes,
                                **self.layout(), **launch.fields()}
        if sampler is not None:
            self.adopt_sampler(sampler)  # records the resume
        self._start_background()
        self._outside.mark("attach()")
        return self.restored

    def _start_background(self) -> None:
        """Once attached (nothing left to refuse): the threads that upload to the store."""
        # environment + code, in a thread (fork-safe: burst.env.spawn); snapshots wait boundedly
        freeze.prefetch(self.store, self.run_id, local=self.local)
        if self.rank == 0 and self._stager is None:  # the rest, throttled behind snapshots
            self._stager = stager.for_run(self.store, self.run_id, self.local, self._live.readiness)

    def _unhook_buffers(self) -> None:
        if self._buffer_hook is not None:
            self._buffer_hook.remove()
            self._buffer_hook = None

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            attach_guard.stop_watcher(self._watcher)
            self._watcher = None

    def _announce_resume(self) -> None:
        """Record the restore as a ``resume`` event, once: after the data checked out."""
        pending, self._pending_resume = self._pending_resume, None
        if pending is not None:
            self.record_event("resume", **pending)

    def _fired_faults(self) -> set[str]:
        """The ``BURST_FAULT`` faults this run's history says already fired (drills only:
        nothing is read when no fault is set)."""
        if not self._injector.pending:
            return set()
        history = events.read(self.local, self.run_id)
        if self.store is not self.local:
            with contextlib.suppress(Exception):  # the local history is the main witness
                history += events.read(self.store, self.run_id)
        return faults.fired(history)

    def _record_fault(self, fault: faults.Fault) -> None:
        self.record_event(faults.FIRED_EVENT, fault=fault.name, kind=fault.kind,
                          step=fault.step)

    @property
    def in_optimizer_step(self) -> bool:
        """True while ``optimizer.step()`` runs: the live state is then half-updated."""
        return self.progress.optimizing

    @property
    def optimizer_stepped(self) -> bool:
        """Whether ``optimizer.step()`` has run in the step in progress."""
        return self.progress.stepped

    def _before_optimizer_step(self, *_: object) -> None:
        self.progress.optimizer_started()
        if self._injector.pending:  # drills only: a run without them pays one test
            self._injector.in_optimizer_step(self.step + 1)

    def _restore(self, manifest: dict) -> state_mod.RestoreReport:
        if self._group.collective:  # each rank reads what it needs from the store
            # a shard that fails its hash on any rank sends every rank to an older snapshot
            # (of this run, so of this global batch: attach's checks hold for it too)
            manifest, saved = fallback.load_agreed(
                self._group, manifest,
                lambda chosen: dist_state.load(self.store, chosen, self.components, self._group),
                lambda step: reader.newest_complete(self.store, self.run_id,
                                                    log=self._skipped_snapshot, below=step),
                lambda step: reader.read_manifest_bytes(self.store, self.run_id, step)[1],
                self._skipped_snapshot)
        else:  # verified in choosing it (newest_intact): not hashed again
            tensors = load_tensors(self.local, manifest,
                                   verified=manifest["step"] == self._verified_step)
            saved = state_mod.decode(manifest, tensors)
        batch = manifest.get("batch", {})
        saved_amp = manifest.get("amp", {}).get("dtype")
        notes = dist_state.restore(self.components, saved, self._group, saved_amp=saved_amp,
                                   amp=self._amp(), seed=self.seed, step=manifest["step"],
                                   saved_world_size=batch.get("world_size") or 1)
        if batch.get("micro") != self.micro_batch:
            notes.append(f"micro-batch {batch.get('micro')} -> {self.micro_batch}, "
                         f"accumulation {batch.get('accumulation')} -> {self.accumulation}")
        if saved_amp != self._amp():
            notes.append(f"precision {saved_amp or 'fp32'} -> {self._amp() or 'fp32'}")
        self.progress.restore(manifest["counters"])
        self.extra = saved.get("extra") or {}
        self.trackers.restore(self.extra.pop(TRACKERS_KEY, None))
        self._saved_sampler = manifest.get("sampler")
        return state_mod.RestoreReport(self.step, self.epoch, self.samples_consumed,
                                       manifest.get("reason", "unknown"), notes)

    # -- the loop -----------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """Epoch numbers from the restored one up to ``count`` (exclusive)."""
        self.total_epochs = count
        while self.epoch < count:
            yield self.epoch
            self.progress.next_epoch()

    def steps(self, loader: DataLoader) -> Iterator[Step]:
        """The optimizer steps of the current epoch, from the next unconsumed sample."""
        sampler = self._check_loader(loader)
        sampler.set_epoch(self.epoch, start=self.samples_in_epoch)
        usable = sampler.epoch_length()
        if loader.drop_last:
            usable = usable // self.planned_micro * self.planned_micro
        self.steps_per_epoch = math.ceil(usable / self.global_batch)
        # DataLoader draws worker seeds from this generator, not from the global RNG, so
        # starting an iterator mid-epoch after a resume does not shift the training RNG.
        loader.generator = torch.Generator().manual_seed(derive_seed("loader", self.seed,
                                                                     self.epoch, bits=63))
        batches = iter(loader)
        self._rechunking = True
        for samples, share in self.plan.step_sizes(sampler.remaining(), loader.drop_last):
            micro_batches, source = self._micro_batches(share, batches)  # this rank's
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

    def _check_loader(self, loader: DataLoader) -> ResumableSampler:
        if not isinstance(loader.sampler, ResumableSampler):
            raise ConfigError("run.steps() needs a DataLoader with sampler=burst.ResumableSampler")
        if loader.batch_size != self.planned_micro:
            raise ConfigError(f"the DataLoader's batch_size is {loader.batch_size}, the run's "
                              f"micro-batch {self.planned_micro}: use batch_size=run.micro_batch "
                              "(read before the first step)")
        if self.world_size > 1 and loader.drop_last:
            raise ConfigError("on several ranks use ResumableSampler(drop_last=True), not the "
                              "DataLoader's drop_last (it would drop per rank)")
        loader.sampler.follow(loader)  # a SeededDataset, whatever the sampler was built over
        return self.adopt_sampler(loader.sampler)

    # -- hooks for loops burst does not own (Run.steps uses them too) -------------------

    def adopt_sampler(self, sampler: object) -> ResumableSampler:
        """Make ``sampler`` the run's: check it is a ``ResumableSampler`` over the data the
        snapshot was taken on, and give it the run's layout (global batch, rank, world)."""
        self._sampler = self.plan.adopt(sampler, self._saved_sampler)
        self._saved_sampler = None
        self._announce_resume()
        return self._sampler

    def begin_step(self) -> None:
        """An optimizer step starts: remember the boundary state an OOM falls back to."""
        self._announce_resume()
        outside = self._outside.check(self.step + 1)  # drawn since the last boundary?
        if outside is not None:
            self.record_event(batches.OUTSIDE_EVENT, step=self.step, message=outside)
        if self._step_ended is None:  # the first step's time counts from its start
            self._step_ended = self._adaptive.clock()
        self._mark_boundary()
        self.progress.begin_step()

    def before_micro_batch(self, index: int) -> None:
        """Micro-batch ``index`` (0-based) of the step in progress is about to run; a
        ``BURST_FAULT`` drill set for it fires here."""
        self._injector.before_micro_batch(self.step + 1, index)

    def end_step(self, samples: int) -> None:
        """The step in progress consumed ``samples`` (on all ranks) and stepped the
        optimizer: count it; this may snapshot, and after a signal stops the process."""
        self.progress.end_step()
        self._complete_step(samples)
        self._outside.mark(f"step {self.step}")

    def abandon_step(self) -> None:
        """The step in progress ends without being counted (it never stepped the
        optimizer); its samples will be drawn again."""
        self.progress.end_step()
        self._outside.mark(f"step {self.step}")

    def recover(self, exc: BaseException) -> int:
        """After a CUDA OOM or GPU failure (``failure.classify(exc)`` is not None) caught
        by a framework: save what can be trusted, leave the failure record, and return
        the exit code to leave with."""
        return self._guard.recover(exc)

    def _complete_step(self, samples: int) -> None:
        self._measure_step(self._adaptive.clock())
        self.progress.count(samples)
        if torch.cuda.is_initialized():  # a flag, never initialising CUDA
            self._record_memory()
        self._control_memory()
        if self._publishing:
            self._publish_figures(samples)
        reason, self._requested = self._requested, None
        asked = self._guard.take_snapshot_request()  # request_snapshot, from another thread
        reason = reason or asked
        if self._guard.stop_requested:
            reason = Reason.SIGNAL
        if fencing.fenced(self.lineage):  # a newer launch took over: train no further
            reason = Reason.FENCED
        collective = self._group.collective
        if collective:  # every rank acts on the votes of the last boundary
            own, asked = (reason, asked), self._asked
            persist, shadow, reason = self._vote.collect()
        else:
            persist = reason is not None or self._persist_due()
            shadow = self._adaptive.shadow_due(self.step)
        if reason == Reason.FENCED:
            fencing.stop(self, self.lineage)
        if persist or shadow:
            self._capture(reason or Reason.PERIODIC, persist=persist)
            self._say_intervals()
        if reason == Reason.SIGNAL:  # a signal reached at least one rank: all stop here
            self._guard.stop_at_boundary()
        if asked is not None:  # e.g. this node is about to be preempted: store it now
            self._guard.store_requested()
        if collective:  # then vote for the next boundary (no stall: StepVote)
            (reason, self._asked) = own  # timed persists: rank 0's clock (it measures)
            self._vote.cast(reason is not None or (self._group.is_writer and self._persist_due()),
                            self._adaptive.shadow_due(self.step), reason)

    def _mark_boundary(self) -> None:
        """Remember what a partial step will disturb: the RNGs and the model's buffers
        (BatchNorm statistics move in the forward pass). An OOM mid-step then still
        yields the exact state of the last step boundary.

        Every step pays for this, so it only copies: the generators' states as their
        libraries hand them out, the buffers into copies allocated once (on their own
        device, so a GPU copy is queued, never waited for). The buffers are looked up
        again only when one was assigned anew (a registration hook says so) or at a
        shadow copy (``Module.to`` replaces them without telling anyone).

        Only a CUDA out-of-memory error or GPU failure rewinds to the boundary, and a
        process that has not initialised CUDA can raise neither (but in a drill). It then
        marks nothing (a quarter of burst's per-step cost on a small CPU model), and
        :meth:`save_boundary` falls back on the RAM shadow should CUDA start mid-step."""
        if not (torch.cuda.is_initialized() or self._injector.pending):
            self._boundary_rng = None
            return
        self._boundary_rng = self._rng_boundary.capture()
        if self._buffers_moved:
            self._find_buffers()
        for name, live in self._live_buffers:
            self._boundary_buffers[name].copy_(live.detach())

    def _find_buffers(self) -> None:
        """(Re)build the list of persistent buffers and their preallocated copies."""
        self._buffers_moved = False
        model = self.components.model
        live = [] if model is None else [(n, b) for n, b in model.named_buffers()
                                         if n in self._saved_buffer_names]
        copies = self._boundary_buffers
        self._boundary_buffers = {
            name: copies[name] if _same_layout(copies.get(name), b)
            else torch.empty_like(b, memory_format=torch.preserve_format)
            for name, b in live}
        self._live_buffers = live

    def _check_buffers(self) -> None:
        """At a shadow copy: notice buffers replaced behind the hook's back."""
        model = self.components.model
        if model is None or self._buffers_moved:
            return
        current = [(n, b) for n, b in model.named_buffers() if n in self._saved_buffer_names]
        if len(current) != len(self._live_buffers) or any(
                n != m or b is not c for (n, b), (m, c) in zip(current, self._live_buffers,
                                                               strict=True)):
            self._buffers_moved = True

    def _buffer_assigned(self, *_: object) -> None:
        self._buffers_moved = True

    def _persist_due(self) -> bool:
        if self.persist_every and self.step % self.persist_every == 0:
            return True
        interval = self._adaptive.intervals().persist_seconds  # the user's, or chosen
        if self._watcher is not None:  # a spot node: short enough to bound the lost work
            cost = (self._uploads.last_seconds if self._uploads else None) or 0.0
            interval = self._watcher.persist_seconds(interval, cost)
        return self._adaptive.persist_due(interval)

    def intervals(self) -> adaptive.Intervals:
        """The shadow and persist intervals in force (the user's, or chosen from measured
        costs), with the work a SIGKILL would lose on average."""
        return self._adaptive.intervals()

    def _measure_step(self, now: float) -> None:
        """Feed the step's training time (burst's own work taken out) and any finished
        background write to the interval policy."""
        wrote = self._tiers.writes != self._writes_seen
        if self._step_ended is not None:  # beside a persist: what it cost training
            self._adaptive.step(now - self._step_ended - self._burst_seconds,
                                persisting=wrote or self._tiers.busy())
        self._step_ended, self._burst_seconds = now, 0.0
        if wrote and self._tiers.last_write_seconds is not None:
            self._writes_seen = self._tiers.writes
            self._adaptive.persist(self._tiers.last_write_seconds)

    def _say_intervals(self) -> None:
        """Record the chosen intervals when they first exist and whenever they change by
        more than half (``burst status`` shows the newest; each snapshot's meta has them)."""
        now = self._adaptive.intervals()
        said = self._intervals_said
        if said is not None and not _moved(said, now):
            return
        self._intervals_said = now
        if now.chosen and now.persist_cost is not None:  # the user's need no telling
            self.record_event(INTERVALS_EVENT, step=self.step, **now.as_dict(),
                              persister_priority=self._tiers.priority)

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self, reason: str = Reason.MANUAL, wait: bool = False) -> None:
        """Snapshot now if between steps, else at the end of the current step.

        On several ranks a snapshot between steps is a collective: call it on every rank
        (a request made during a step, on any rank, is agreed on at the step's end)."""
        if self.progress.in_step:
            self._requested = reason
            return
        self._capture(reason, persist=True)
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
        deadline = None if timeout is None else time.monotonic() + timeout
        self._tiers.flush(timeout)
        if self._uploads is not None:
            self._uploads.flush(None if deadline is None else deadline - time.monotonic())
            sync.copy_extras(self.local, self.store, self.run_id)  # events written since

    def log(self, **values: float) -> None:
        """Record metrics of the step just finished (``run.log(loss=loss)``) for
        ``burst report``; buffered, written with the next snapshot (rank 0 only)."""
        if self._group.is_writer:  # inside a step's body the step is not yet counted
            step = self.step + 1 if self.progress.in_step else self.step
            self._metrics.add(step, self.samples_consumed, values)
            self._live.logged(values)

    def close(self) -> None:
        """Snapshot the final state and wait for it to be stored."""
        if self._stager is not None:
            self._stager.stop()  # returns at once: never holds up the final snapshot
        self._vote.drain()  # the last boundary's votes: the final snapshot serves them all
        self._capture(Reason.FINAL, persist=True)
        upload_error: StoreError | None = None
        try:
            self._group.settle(self.flush)  # rank 0 stores it; every rank learns the outcome
        except SnapshotError:
            if fencing.fenced(self.lineage):  # refused: a newer launch owns the run
                fencing.stop(self, self.lineage)
            raise
        except StoreError as exc:  # the upload, once the local tier holds the snapshot
            if self._uploads is None or not outage.kept_locally(self.local, self.run_id,
                                                                self.step):
                raise
            upload_error = exc
        self._metrics.flush()
        self.record_event("finish", step=self.step)
        self.trackers.close()
        self._guard.uninstall()
        if self._buffer_hook is not None:
            self._buffer_hook.remove()
            self._buffer_hook = None
        if self._watcher is not None:
            self._watcher.stop()
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

    def _capture(self, reason: str, persist: bool) -> Captured | None:
        entered = self._adaptive.clock()
        # the environment freeze is named by the persister (Tiers.complete_meta), which
        # waits for it there: the training thread never waits for a freeze
        meta = self._meta(reason, frozen=False)
        started = self._adaptive.clock()
        self._check_buffers()
        state_tree, live, boxes = dist_state.capture(self.components, self._extra(), self._group)
        captured = self._tiers.capture(self.step, state_tree, live, meta, persist=persist,
                                       boxes=boxes)  # on several ranks: this rank's piece
        done = self._adaptive.clock()
        self._adaptive.shadow(done - started)
        self._burst_seconds += done - entered  # not training time either
        if persist:
            self._adaptive.persisted()
        return captured

    def _extra(self) -> dict[str, Any]:
        """``extra`` as a snapshot keeps it: with the trackers' state when there are any."""
        if not self.trackers:
            return self.extra
        return {**self.extra, TRACKERS_KEY: self.trackers.state()}

    def save_boundary(self, reason: str) -> int | None:
        """Snapshot the live state as it was at the last step boundary (after an OOM);
        return its step. On several ranks the other ranks may be stuck in a collective, so
        no collective capture is possible: every rank keeps its RAM shadow instead."""
        if self.world_size > 1 or self._boundary_rng is None:  # None: no boundary marked
            return self.persist_shadow(reason)
        tree, live = state_mod.capture(self.components, self._extra(), rng_state=self._boundary_rng,
                                       model_buffers=self._boundary_buffers)
        self._tiers.capture(self.step, tree, live, self._meta(reason), persist=True)
        return self.step

    def persist_shadow(self, reason: str) -> int | None:
        """Queue the newest RAM copy under ``reason`` without touching the device. On
        several ranks each rank queues its own piece, and rank 0 waits for the others' at
        most the grace period: a rank stuck in a collective never sends one, and the
        newest complete snapshot then stands."""
        if self._stager is not None:
            self._stager.stop()  # the emergency snapshot has the uplink to itself
        latest = self._tiers.latest
        if latest is None:
            return None
        sharding = self._tiers.sharding
        if sharding is not None:  # after a failure the other ranks may never send theirs
            self._tiers.sharding = replace(sharding, timeout=min(sharding.timeout,
                                                                 self._guard.grace_seconds))
        self._tiers.persist(replace(latest, meta={**latest.meta, "reason": reason}))
        return latest.step

    def _on_commit(self, manifest: dict) -> None:
        self._metrics.flush()
        self._live.committed(manifest)
        self.record_event("snapshot", step=manifest["step"], reason=manifest["reason"])
        if self._uploads is None:
            return
        if reader.is_sharded(manifest):  # already in the store
            sync.copy_extras(self.local, self.store, self.run_id)  # events written since
        else:
            self._uploads.submit(manifest["step"])

    def _newest_manifest(self) -> dict | None:
        """The newest intact snapshot, pulled into the local tier first when the remote is
        newer. One rule on every store: a damaged newer snapshot is skipped for an older
        intact one, loudly (a warning and a ``snapshot-skipped`` event).

        On several ranks the ranks restore straight from the store (each reads its own
        byte ranges), so the store's newest complete snapshot is chosen there, after any
        whole snapshot a crash left in the local tier has gone up.

        The fence decides which local snapshots count (``burst.snapshot.restorable``): a
        fenced writer's refused snapshot is skipped, loudly, however new; and a launch a
        newer one already replaced stops here (exit 90)."""
        if self._group.collective:
            if self._uploads is not None:
                try:
                    self._uploads.flush()
                except lineage.FencedError as exc:  # a fenced writer's leftover: refused
                    self._skipped_snapshot(str(exc))
            self._verified_step = None
            return reader.newest_complete(self.store, self.run_id, log=self._skipped_snapshot)
        remote_steps = [] if self.local is self.store else reader.list_steps(self.store,
                                                                             self.run_id)
        refused = restorable.refused_steps(self.local, self.store, self.run_id, self.lineage,
                                           remote_steps, self._skipped_snapshot)
        if fencing.fenced(self.lineage):  # replaced before it attached: train nothing
            fencing.stop(self, self.lineage)
        if self.local is not self.store:
            local_steps = [s for s in reader.list_steps(self.local, self.run_id)
                           if s not in refused]
            if remote_steps and (not local_steps or remote_steps[-1] > local_steps[-1]):
                try:
                    pulled = sync.pull(self.store, self.local, self.run_id,
                                       log=self._skipped_snapshot)
                    refused.discard(pulled.step)  # the store's copy took its place
                except SnapshotError as exc:
                    if not local_steps:
                        raise
                    self._skipped_snapshot(f"{exc}; using the local tier's snapshots")
        newest = reader.newest_intact(self.local, self.run_id, log=self._skipped_snapshot,
                                      refused=refused)
        self._verified_step = None if newest is None else newest["step"]
        return newest

    def _skipped_snapshot(self, message: str) -> None:
        warnings.warn(f"burst: {message}", RuntimeWarning, stacklevel=2)
        self.record_event("snapshot-skipped", message=message)

    def record_event(self, name: str, /, **fields: Any) -> None:
        """Record an event; the history is worth less than the run, so failures only warn."""
        if not self._group.is_writer:  # rank 0 tells the run's story; others add failures
            if name in ("start", "resume", "finish"):
                return
            fields.setdefault("rank", self.rank)
        events.record(self.local, self.run_id, name, **fields)  # uploaded with snapshots

    def _meta(self, reason: str, frozen: bool = True) -> dict[str, Any]:
        """The manifest fields of a capture; ``frozen=False`` (a RAM shadow nobody may
        ever persist) leaves the environment freeze to :meth:`_freeze_fields`, which the
        persister calls, so the training loop never waits for a freeze to copy state."""
        self._announce_resume()
        meta = {
            "reason": reason,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "counters": self.progress.counters(),
            "batch": self.layout(),
            "amp": {"dtype": self._amp()},
            "sampler": self._sampler.state() if self._sampler else self._saved_sampler,
            "versions": {"torch": torch.__version__, "python": platform.python_version(),
                         "cuda": torch.version.cuda, "platform": sys.platform},
            "card": _card_name(),
            "memory": {"peak_bytes_by_micro_batch": dict(self._peak_memory)},
            "intervals": self._adaptive.intervals().as_dict(),
        }
        return self._freeze_fields(meta) if frozen else meta

    def _freeze_fields(self, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` with the frozen environment and code named (unless it already is)."""
        if "lockfile_hash" in meta:
            return meta
        # bounded: a freeze not done in time is "pending" here and named by later snapshots;
        # a snapshot taken because something failed never waits for it
        wait = freeze.SNAPSHOT_WAIT_SECONDS if meta["reason"] in _ROUTINE_REASONS else 0.0
        frozen = freeze.freeze_run(self.store, self.run_id, local=self.local, wait=wait)
        inputs_part.refresh(self.store, self.run_id)  # read something new: staged again
        return {**meta, "lockfile_hash": frozen.lockfile_hash, "code_ref": frozen.code_ref,
                **({"freeze": "pending"} if frozen.pending else {})}

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler that is enabled exactly when the run's precision needs one (fp16)."""
        device = _device_of(self.components.model)
        return torch.amp.GradScaler(device, enabled=self.amp == "fp16")

    def layout(self) -> dict[str, Any]:
        """The batch layout: global and micro batch, accumulation, world size, and whether
        the model is sharded (FSDP2: the planner then counts its state per rank)."""
        layout = self.plan.as_dict()
        if dist_state.sharded(self.components):
            layout["sharded"] = True
        return layout

    def _amp(self) -> str | None:
        scaler = self.components.scaler
        if self.amp is None and scaler is not None and scaler.is_enabled():
            return "fp16"  # a user-managed fp16 autocast: the scaler gives it away
        return self.amp

    def autocast(self, device_type: str | None = None) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the run's precision (a no-op in full precision)."""
        if self.amp is None:
            return contextlib.nullcontext()
        device = device_type or _device_of(self.components.model)
        return torch.autocast(device, dtype=AMP_DTYPES[self.amp])

    def _publish_figures(self, samples: int) -> None:
        """For ``burst run --metrics-port`` (rank 0, when the agent asked)."""
        uploading = None if self._uploads is None else self._uploads.busy()
        reserved = torch.cuda.memory_reserved() if torch.cuda.is_initialized() else None
        self._live.step_done(self.step, samples, self.micro_batch, self.accumulation,
                             uploading, reserved)

    def memory_alert(self) -> None:
        """A memory alert fired (callable from any thread): the next step boundary
        shrinks the micro-batch (when this run re-plans memory at all)."""
        if self._memory is not None:
            self._memory.alert()

    def _memory_controller(self, target: float | None, rules: tuple[str, ...] | list[str]
                           ) -> memory_control.Controller | None:
        """The in-process re-plan, for one process only: ranks deciding apart would run
        different numbers of micro-batches and hang in a collective."""
        if target is None or self.world_size > 1:
            return None
        sizes = memory_control.candidates(self.global_batch, self.world_size, self.micro_batch)
        return memory_control.Controller(self.micro_batch, sizes, target, rules=rules)

    def _micro_batches(self, share: int, batches: Iterator[Any]) -> tuple[int, Iterator[Any]]:
        """How many micro-batches this rank's ``share`` makes, and where they come from:
        the loader's batches as they are, or each split into the re-planned size."""
        if self.micro_batch == self.planned_micro:
            return math.ceil(share / self.micro_batch), batches
        count = memory_control.micro_count(share, self.planned_micro, self.micro_batch)
        loader_batches = math.ceil(share / self.planned_micro)
        return count, memory_control.rechunk(batches, loader_batches, self.micro_batch)

    def _control_memory(self) -> None:
        """At a step boundary: read the card, apply due rules, switch micro-batch."""
        if self._memory is None or not self._rechunking:
            return
        reading = self._memory_reader()
        if reading is None and not self._memory.alerted:  # no card read, no alert: no change
            return
        for rule in self._memory.rules_due(reading):
            self._apply_rule(rule, reading)
        decision = self._memory.decide(self.micro_batch, reading)
        if decision is None:
            return
        old_accumulation = self.accumulation
        self.plan = self.plan.with_micro(decision.new)
        self.record_event(memory_control.EVENT, step=self.step, reason=decision.reason,
                          old_micro=decision.old, new_micro=decision.new,
                          old_accumulation=old_accumulation, new_accumulation=self.accumulation,
                          **_reading_fields(reading), predicted_bytes=decision.predicted)

    def _apply_rule(self, rule: memory_control.Rule,
                    reading: memory_control.Reading | None) -> None:
        if rule.key == "amp":
            old, self.amp = self.amp, parse_amp(rule.value)
            changed: dict[str, Any] = {"old": old, "new": self.amp}
        else:
            types = [t.strip() for t in rule.value.split(",") if t.strip()]
            changed = {"modules": checkpointing.wrap(self.components.model, types)}
        self.record_event(memory_control.RULE_EVENT, step=self.step, rule=rule.text,
                          action=rule.key, **changed, **_reading_fields(reading))

    def _record_memory(self) -> None:
        """The step's peak on the card, kept per micro-batch size (CUDA in use)."""
        key = str(self.micro_batch)
        peak = torch.cuda.max_memory_allocated()
        self._peak_memory[key] = max(self._peak_memory.get(key, 0), peak)


def _reading_fields(reading: memory_control.Reading | None) -> dict[str, Any]:
    if reading is None:
        return {"peak_bytes": None, "total_bytes": None}
    return {"peak_bytes": reading.peak, "total_bytes": reading.total}


def _persist_seconds(value: float | str | None) -> float | str | None:
    if value is None or value == adaptive.AUTO:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"persist_seconds must be a positive number, None or "
                          f"{adaptive.AUTO!r}, got {value!r}")
    return float(value)


def _seconds_from_env(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"${ENV_PERSIST_SECONDS} must be a number of seconds, "
                          f"got {text!r}") from None


def _budget(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"overhead_budget is a fraction of training time (0.01 is 1%), "
                          f"got {value!r}")
    return float(value)


def _moved(said: adaptive.Intervals, now: adaptive.Intervals) -> bool:
    """Whether the intervals changed enough to say so again (by more than half)."""
    if (said.persist_cost is None) != (now.persist_cost is None):
        return True
    pairs = [(said.shadow_every, now.shadow_every), (said.persist_seconds, now.persist_seconds)]
    return any((a is None) != (b is None) or (a and b and not 0.5 <= b / a <= 2)
               for a, b in pairs)


def _same_layout(copy: torch.Tensor | None, live: torch.Tensor) -> bool:
    return (copy is not None and copy.shape == live.shape and copy.dtype == live.dtype
            and copy.device == live.device)


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


def _device_of(model: torch.nn.Module | None) -> str:
    if model is not None:
        for param in model.parameters():
            return param.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _card_name() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_device_name()
    return "cpu"

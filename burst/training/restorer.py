"""The load side of a run's snapshots: choose the newest one it may continue from, pull it
into the local tier, and put its state back into the live objects.

Split from the save side (``burst.training.snapshotter``) as DCP splits its loader from its
saver: restoring happens once, at attach, and decides things saving never does (which
snapshot counts after a fence, a damaged blob, a newer copy in the store). ``resume`` puts
the result where the run keeps it: the counters in its ``Progress``, the objects, ``extra``
and the sampler's place in its ``Subject``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from burst.errors import SnapshotError
from burst.parallel import fallback
from burst.parallel import state as dist_state
from burst.parallel.group import Group
from burst.snapshot import lineage, reader, restorable, sync
from burst.snapshot.tensors import load_tensors
from burst.snapshot.upload import UploadQueue
from burst.state import capture as state_mod
from burst.store import Store
from burst.training import command as launch
from burst.training import fencing, membership
from burst.training.layout import Layout
from burst.training.progress import Progress
from burst.training.sampler import ResumableSampler
from burst.training.subject import Subject

SKIPPED_EVENT = "snapshot-skipped"
RESUME_EVENT = "resume"


class Restorer:
    """Chooses and loads a run's newest restorable snapshot (every rank holds one)."""

    def __init__(self, store: Store, local: Store, run_id: str, group: Group,
                 generation: lineage.Lineage | None, uploads: UploadQueue | None,
                 record: Callable[..., None], stop_fenced: Callable[[], object]) -> None:
        self.store, self.local, self.run_id = store, local, run_id
        self._group, self._lineage, self._uploads = group, generation, uploads
        self._record = record
        self._stop_fenced = stop_fenced  # leaves the process (exit 90)
        self._verified_step: int | None = None  # the snapshot whose blobs this rank hashed
        # the ``resume`` event of a restore, recorded once the data checks out (or at the
        # first step or snapshot of a loop without a sampler): a refused resume never
        # enters the run's history
        self.pending_resume: dict[str, Any] | None = None
        self._announced = False
        self.first_step: membership.FirstStep | None = None  # records the restore's cost

    def choose(self) -> dict | None:
        """The manifest to restore: rank 0 chooses, every rank reads that one."""
        return dist_state.newest_manifest(
            self._group, self.newest,
            lambda step: reader.read_manifest(self.store, self.run_id, step))

    def newest(self) -> dict | None:
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
                    self.skipped(str(exc))
            self._verified_step = None
            return reader.newest_complete(self.store, self.run_id, log=self.skipped)
        remote_steps = [] if self.local is self.store else reader.list_steps(self.store,
                                                                             self.run_id)
        refused = restorable.refused_steps(self.local, self.store, self.run_id, self._lineage,
                                           remote_steps, self.skipped)
        if fencing.fenced(self._lineage):  # replaced before it attached: train nothing
            self._stop_fenced()
        if self.local is not self.store:
            self._pull_newer(remote_steps, refused)
        newest = reader.newest_intact(self.local, self.run_id, log=self.skipped,
                                      refused=refused)
        self._verified_step = None if newest is None else newest["step"]
        return newest

    def _pull_newer(self, remote_steps: list[int], refused: set[int]) -> None:
        """Pull the store's newest snapshot into the local tier when it is newer."""
        local_steps = [s for s in reader.list_steps(self.local, self.run_id)
                       if s not in refused]
        if remote_steps and (not local_steps or remote_steps[-1] > local_steps[-1]):
            try:
                pulled = sync.pull(self.store, self.local, self.run_id, log=self.skipped)
                refused.discard(pulled.step)  # the store's copy took its place
            except SnapshotError as exc:
                if not local_steps:
                    raise
                self.skipped(f"{exc}; using the local tier's snapshots")

    def resume(self, manifest: dict, subject: Subject, progress: Progress, seed: int,
               sampler: ResumableSampler | None) -> state_mod.RestoreReport:
        """Continue ``subject`` from ``manifest``: checked first (the global batch, and
        with ``sampler`` the data), then loaded; the ``resume`` event waits for
        :meth:`announce`, so a resume refused later is never in the run's history."""
        subject.plan.check_snapshot(manifest, sampler)  # before any state changes or event
        manifest, saved, notes = self.load(manifest, subject.components, subject.precision(),
                                           seed, subject.plan)
        progress.restore(manifest["counters"])
        subject.restored(saved, manifest)
        report = state_mod.RestoreReport(progress.step, progress.epoch,
                                         progress.samples_consumed,
                                         manifest.get("reason", "unknown"), notes)
        self.pending_resume = {"step": report.step, "notes": notes, **subject.layout(),
                               **launch.fields()}
        return report

    def load(self, manifest: dict, components: state_mod.Components, amp: str | None,
             seed: int, layout: Layout) -> tuple[dict, dict[str, Any], list[str]]:
        """Put ``manifest``'s state into ``components``: the manifest actually restored
        (on several ranks a damaged shard falls every rank back to an older one), the
        saved non-tensor state, and notes on what differs from the snapshot's run."""
        if self._group.collective:  # each rank reads what it needs from the store
            # a shard that fails its hash on any rank sends every rank to an older snapshot
            # (of this run, so of this global batch: attach's checks hold for it too)
            manifest, saved = fallback.load_agreed(
                self._group, manifest,
                lambda chosen: dist_state.load(self.store, chosen, components, self._group),
                lambda step: reader.newest_complete(self.store, self.run_id,
                                                    log=self.skipped, below=step),
                lambda step: reader.read_manifest_bytes(self.store, self.run_id, step)[1],
                self.skipped)
        else:  # verified in choosing it (newest_intact): not hashed again
            tensors = load_tensors(self.local, manifest,
                                   verified=manifest["step"] == self._verified_step)
            saved = state_mod.decode(manifest, tensors)
        batch = manifest.get("batch", {})
        saved_amp = manifest.get("amp", {}).get("dtype")
        notes = dist_state.restore(components, saved, self._group, saved_amp=saved_amp,
                                   amp=amp, seed=seed, step=manifest["step"],
                                   saved_world_size=batch.get("world_size") or 1)
        if batch.get("micro") != layout.micro_batch:
            notes.append(f"micro-batch {batch.get('micro')} -> {layout.micro_batch}, "
                         f"accumulation {batch.get('accumulation')} -> {layout.accumulation}")
        if saved_amp != amp:
            notes.append(f"precision {saved_amp or 'fp32'} -> {amp or 'fp32'}")
        self._watch_first_step(components, manifest)
        return manifest, saved, notes

    def _watch_first_step(self, components: state_mod.Components, manifest: dict) -> None:
        """The restore is a change of the run's membership: its cost is recorded at the
        first optimizer step (rank 0 tells it; a loop without an optimizer has no step)."""
        if not self._group.is_writer or components.optimizer is None:
            return
        if self.first_step is not None:
            self.first_step.cancel()
        self.first_step = membership.FirstStep(
            components.optimizer, membership.last_loss(membership.history(
                self.run_id, self.local, self.store)),
            step=manifest["step"], world_after=self._group.world_size,
            world_saved=manifest.get("batch", {}).get("world_size"),
            announced=lambda: self._announced, record=self._record)

    def announce(self) -> None:
        """Record the restore as a ``resume`` event, once."""
        pending, self.pending_resume = self.pending_resume, None
        if pending is not None:
            self._record(RESUME_EVENT, **pending)
            self._announced = True

    def skipped(self, message: str) -> None:
        """A snapshot passed over: said loudly, and kept in the run's history."""
        warnings.warn(f"burst: {message}", RuntimeWarning, stacklevel=2)
        self._record(SKIPPED_EVENT, message=message)

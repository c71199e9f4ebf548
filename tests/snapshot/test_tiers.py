"""The RAM shadow and the persister: packed shadows written as they lie, a persister that
stays up between close writes, and temporaries swept now and then rather than every time."""

from __future__ import annotations

import os
import threading
import time

import torch

from burst.snapshot import format as fmt
from burst.snapshot import reader, retention, tiers
from burst.snapshot.tensors import layout_blobs, load_tensors
from burst.snapshot.tiers import Captured, ShadowBuffers, Tiers
from burst.store import LocalStore

RUN = "run"


def small_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Small tensors of every awkward kind, so the format packs them into one blob."""
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(7, 3, generator=g),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "flags": torch.rand(9, generator=g) > 0.5,
        "count": torch.tensor(seed + 3, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "odd": torch.arange(3, dtype=torch.int16),
    }


def as_captured(step: int, tensors: dict[str, torch.Tensor],
                buffers: ShadowBuffers | None = None) -> Captured:
    tree = {name: {"$tensor": name} for name in tensors}
    return Captured(step, tree, tensors, {"reason": "test", "counters": {}}, buffers)


def persister_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "burst-persist"]


def test_a_shadow_copy_lands_each_small_tensor_at_its_place_in_one_pack():
    live = small_state()
    shadow = ShadowBuffers()
    copies = shadow.copy_from(live)
    [blob] = layout_blobs(copies)
    packed = shadow.packed(blob)
    assert packed is not None and len(packed) == blob.size
    assert bytes(packed) == bytes(blob.payload(live))  # padding zeroed, as a gathered blob
    assert all(torch.equal(copies[name], tensor) for name, tensor in live.items())


def test_a_snapshot_from_a_packed_shadow_has_the_digests_of_one_gathered_from_tensors(tmp_path):
    live = small_state()
    shadow = ShadowBuffers()
    from_shadow = tiers.write_snapshot(LocalStore(tmp_path / "a"), RUN,
                                       as_captured(1, shadow.copy_from(live), shadow))
    gathered = tiers.write_snapshot(LocalStore(tmp_path / "b"), RUN,
                                    as_captured(1, {k: v.clone() for k, v in live.items()}))
    assert from_shadow["blobs"] == gathered["blobs"]
    store = LocalStore(tmp_path / "a")
    loaded = load_tensors(store, reader.read_manifest(store, RUN))
    assert all(torch.equal(loaded[name], tensor) for name, tensor in live.items())


def test_a_new_shadow_copy_overwrites_the_pack_in_place():
    shadow = ShadowBuffers()
    shadow.copy_from(small_state(0))
    [blob] = layout_blobs(shadow.tensors)
    before = shadow.packed(blob)
    shadow.copy_from(small_state(1))
    assert shadow.packed(blob) is before  # the same memory, no new allocation
    assert bytes(before) == bytes(blob.payload(small_state(1)))


def test_a_tensor_too_big_to_pack_keeps_a_buffer_of_its_own():
    live = {"big": torch.zeros(fmt.PACK_THRESHOLD // 4 + 1), "small": torch.ones(3)}
    shadow = ShadowBuffers()
    copies = shadow.copy_from(live)
    assert all(shadow.packed(blob) is None for blob in layout_blobs(copies))  # packs of one
    assert torch.equal(copies["big"], live["big"]) and torch.equal(copies["small"], live["small"])


def test_the_persister_stays_up_between_close_writes_and_leaves_once_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "LINGER_SECONDS", 0.5)
    earlier = set(persister_threads())  # an earlier test's persister, still lingering
    persister = Tiers(LocalStore(tmp_path), RUN, keep=2)
    persister.persist(as_captured(1, small_state(1)))
    persister.flush(timeout=30)
    [thread] = [t for t in persister_threads() if t not in earlier]
    persister.persist(as_captured(2, small_state(2)))
    persister.flush(timeout=30)
    # the same thread took the second write
    assert [t for t in persister_threads() if t not in earlier] == [thread]
    assert reader.list_steps(LocalStore(tmp_path), RUN) == [1, 2]
    thread.join(timeout=10)
    assert not thread.is_alive()
    persister.persist(as_captured(3, small_state(3)))  # a fresh one starts when needed
    persister.flush(timeout=30)
    assert reader.list_steps(LocalStore(tmp_path), RUN) == [2, 3]


def test_flush_returns_once_written_while_the_persister_idles(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "LINGER_SECONDS", 600.0)
    persister = Tiers(LocalStore(tmp_path), RUN, keep=2)
    persister.persist(as_captured(1, small_state()))
    persister.flush(timeout=30)  # raises if it waited for the idle thread to leave
    assert not persister.busy() and persister_threads()


def stale_temporary(store: LocalStore, name: str) -> str:
    """A temporary such as a write killed before its rename leaves, a day old."""
    path = store.root / RUN / "snapshots" / f".{name}.tmp"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"{")
    then = time.time() - retention.TEMP_TTL - 60
    os.utime(path, (then, then))
    return str(path)


def test_gc_without_a_sweep_leaves_temporaries_alone(tmp_path):
    store = LocalStore(tmp_path)
    for step in (1, 2):
        tiers.write_snapshot(store, RUN, as_captured(step, small_state(step)))
    stale = stale_temporary(store, "killed")
    report = retention.gc(store, RUN, keep_last=1, sweep=False)
    assert report.dropped == [1] and report.temporaries_deleted == 0
    assert os.path.exists(stale)


def test_a_persister_sweeps_temporaries_at_its_first_prune_then_once_an_interval(
        tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    persister = Tiers(store, RUN, keep=1)
    first = stale_temporary(store, "first")
    for step in (1, 2):
        persister.persist(as_captured(step, small_state(step)))
        persister.flush(timeout=30)
    assert not os.path.exists(first)  # the first prune swept
    second = stale_temporary(store, "second")
    persister.persist(as_captured(3, small_state(3)))
    persister.flush(timeout=30)
    assert os.path.exists(second)  # within the interval: pruned, not swept
    monkeypatch.setattr(tiers, "SWEEP_SECONDS", 0.0)
    persister.persist(as_captured(4, small_state(4)))
    persister.flush(timeout=30)
    assert not os.path.exists(second)
    assert reader.list_steps(store, RUN) == [4]


def test_a_remembered_manifest_is_parsed_afresh_once_its_bytes_differ(tmp_path):
    store = LocalStore(tmp_path)
    manifest = tiers.write_snapshot(store, RUN, as_captured(1, small_state()))
    raw = store.get(fmt.manifest_key(RUN, 1))
    reader.remember_digests(raw, RUN, 1, frozenset({"f" * 64}))  # as if the writer said so
    store.put(fmt.manifest_key(RUN, 1), raw + b" ")  # the same JSON, other bytes
    assert reader.referenced_blobs(store, RUN, 1) == frozenset(manifest["blobs"])


def test_a_remembered_manifest_answers_for_its_own_step_only(tmp_path):
    store = LocalStore(tmp_path)
    manifest = tiers.write_snapshot(store, RUN, as_captured(1, small_state()))
    raw = store.get(fmt.manifest_key(RUN, 1))
    reader.remember_digests(raw, RUN, 2, frozenset({"f" * 64}))
    assert reader.referenced_blobs(store, RUN, 1) == frozenset(manifest["blobs"])


def test_a_child_forked_while_the_persister_idles_writes_with_a_persister_of_its_own(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "LINGER_SECONDS", 600.0)
    persister = Tiers(LocalStore(tmp_path), RUN, keep=3)
    persister.persist(as_captured(1, small_state(1)))
    persister.flush(timeout=30)  # the parent's persister now idles, waiting for work
    pid = os.fork()
    if pid == 0:  # the child: its copy of the flag says "up", no thread came along
        code = 1
        try:
            persister.persist(as_captured(2, small_state(2)))
            persister.flush(timeout=30)
            code = 0 if reader.list_steps(LocalStore(tmp_path), RUN) == [1, 2] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


class HeldStore(LocalStore):
    """A local tier whose put of one key waits until the test lets it go."""

    def __init__(self, root: os.PathLike[str], held: str) -> None:
        super().__init__(root)
        self.held, self.reached, self.release = held, threading.Event(), threading.Event()

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        if key == self.held:
            self.reached.set()
            self.release.wait(60)
        super().put(key, data)


def test_a_queued_snapshot_is_written_before_the_last_ones_prune_and_flush_waits_for_both(
        tmp_path):
    store = HeldStore(tmp_path, fmt.manifest_key(RUN, 2))
    seen: dict[int, list[int]] = {}
    persister = Tiers(store, RUN, keep=1, on_commit=lambda manifest: seen.setdefault(
        manifest["step"], reader.list_steps(store, RUN)))
    persister.persist(as_captured(1, small_state(1)))
    persister.flush(timeout=30)
    persister.persist(as_captured(2, small_state(2)))
    assert store.reached.wait(60)  # step 2's manifest is being put
    persister.persist(as_captured(3, small_state(3)))  # queued meanwhile
    store.release.set()
    persister.flush(timeout=60)
    assert seen[2] == [1, 2]  # step 1 outlived step 2's commit: step 3 was waiting
    assert seen[3] == [3]  # pruned before step 3's commit was announced, as ever
    assert reader.list_steps(store, RUN) == [3]

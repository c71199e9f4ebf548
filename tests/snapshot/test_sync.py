"""Push and pull: crash-safe commits, incremental uploads, verified downloads with fallback."""

from __future__ import annotations

import pytest
import torch

from burst.errors import SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader, sync
from burst.snapshot.tensors import load_tensors
from burst.store import LocalStore, MemoryStore, open_store
from burst.store.retry import RetryPolicy
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import aws_env

FAST = RetryPolicy(attempts=3, base=0.001, cap=0.001)


def frozen_backbone(seed: int) -> dict[str, torch.Tensor]:
    """A 'model' whose backbone never changes and whose head does (a LoRA-style fine-tune)."""
    g = torch.Generator().manual_seed(0)
    backbone = {f"backbone.{i}": torch.randn(400_000, generator=g) for i in range(4)}
    head = torch.Generator().manual_seed(seed)
    return {**backbone, "head": torch.randn(400_000, generator=head),
            "bias": torch.randn(10, generator=head)}


@pytest.fixture
def remote(request, monkeypatch):
    aws_env(monkeypatch)
    server = request.getfixturevalue("seaweed")
    return open_store(server.url(), **server.options())


@pytest.fixture
def local(tmp_path):
    return LocalStore(tmp_path / "local")


def test_a_pushed_snapshot_pulls_back_identical_into_a_fresh_tier(local, remote, tmp_path):
    tensors = frozen_backbone(1)
    take(local, 10, tensors)
    sync.push(local, remote, "run")
    fresh = LocalStore(tmp_path / "fresh")
    transfer = sync.pull(remote, fresh, "run")
    assert transfer.step == 10 and not transfer.fallbacks
    loaded = load_tensors(fresh, reader.read_manifest(fresh, "run"))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_a_frozen_backbone_second_snapshot_uploads_only_the_changed_tensors(local, remote):
    take(local, 1, frozen_backbone(1))
    first = sync.push(local, remote, "run")[0]
    manifest = take(local, 2, frozen_backbone(2))
    second = sync.push(local, remote, "run")[0]
    changed = {d for name, e in manifest["tensors"].items() if not name.startswith("backbone")
               for d in [e["blob"]]}
    assert second.bytes_sent == sum(manifest["blobs"][d]["size"] for d in changed)
    assert second.bytes_sent <= 0.35 * first.bytes_sent
    assert second.bytes_sent + second.bytes_skipped == second.total_bytes


class DiesAfter(MemoryStore):
    """A remote whose uploader is killed after ``n`` blob writes (nothing after lands)."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name)
        self.left, self.sent = n, 0

    def put(self, key, data):
        if "/blobs/" in key:
            if self.left <= 0:
                raise KeyboardInterrupt("killed")
            self.left -= 1
            self.sent += len(memoryview(data))
        super().put(key, data)


def test_an_interrupted_upload_leaves_no_visible_snapshot(local):
    take(local, 5, frozen_backbone(1))
    remote = DiesAfter("interrupted-1", n=2)
    with pytest.raises(KeyboardInterrupt):
        sync.push(local, remote, "run", policy=FAST)
    assert reader.list_steps(remote, "run") == []
    assert reader.read_manifest(remote, "run") is None


def test_a_resumed_upload_does_not_resend_blobs_that_landed(local):
    manifest = take(local, 5, frozen_backbone(1))
    total = sum(info["size"] for info in manifest["blobs"].values())
    killed = DiesAfter("interrupted-2", n=2)
    with pytest.raises(KeyboardInterrupt):
        sync.push(local, killed, "run", policy=FAST)
    resumed = sync.push(local, MemoryStore("interrupted-2"), "run", policy=FAST)[0]
    assert resumed.bytes_sent == total - killed.sent and resumed.bytes_skipped == killed.sent
    assert reader.verify(MemoryStore("interrupted-2"), "run")["step"] == 5


def test_pushing_a_snapshot_the_store_already_has_sends_nothing(local, remote):
    take(local, 3, frozen_backbone(1))
    sync.push(local, remote, "run")
    again = sync.push(local, remote, "run")[0]
    assert again.manifest == "present" and again.bytes_sent == 0


def test_push_refuses_a_local_blob_that_does_not_match_its_hash(local):
    manifest = take(local, 1, {"w": torch.randn(1000)})
    digest = next(iter(manifest["blobs"]))
    path = local.root / fmt.blob_key("run", digest)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    remote = MemoryStore("corrupt-source")
    with pytest.raises(SnapshotError, match="corrupt"):
        sync.push(local, remote, "run", policy=FAST)
    assert remote.list("run/blobs/") == [] and reader.list_steps(remote, "run") == []


def damage_newest(remote, how: str) -> str:
    manifest = reader.read_manifest(remote, "run")
    previous = reader.read_manifest(remote, "run", reader.list_steps(remote, "run")[-2])
    digest = next(d for d in manifest["blobs"] if d not in previous["blobs"])
    key = fmt.blob_key("run", digest)
    if how == "corrupt":
        data = bytearray(remote.get(key))
        data[len(data) // 2] ^= 0xFF
        remote.put(key, bytes(data))
    else:
        remote.delete(key)
    return digest


@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_pull_falls_back_to_the_previous_snapshot_when_a_blob_is_bad(local, remote, tmp_path,
                                                                      how):
    take(local, 1, frozen_backbone(1))
    take(local, 2, frozen_backbone(2))
    sync.push(local, remote, "run", every=True)
    digest = damage_newest(remote, how)
    messages: list[str] = []
    fresh = LocalStore(tmp_path / "fresh")
    transfer = sync.pull(remote, fresh, "run", log=messages.append)
    assert transfer.step == 1
    assert len(transfer.fallbacks) == 1 and digest[:12] in transfer.fallbacks[0]
    assert messages and "falling back to step 1" in messages[0]
    assert reader.list_steps(fresh, "run") == [1]  # the damaged snapshot never appears
    assert fresh.size(fmt.blob_key("run", digest)) is None  # nor its bad blob
    reader.verify(fresh, "run")


def test_pull_with_no_intact_snapshot_fails_with_the_reason(local, tmp_path):
    manifest = take(local, 1, {"w": torch.randn(1000)})
    remote = MemoryStore("all-bad")
    sync.push(local, remote, "run", policy=FAST)
    remote.delete(fmt.blob_key("run", next(iter(manifest["blobs"]))))
    with pytest.raises(SnapshotError, match=r"could be pulled intact.*missing"):
        sync.pull(remote, LocalStore(tmp_path / "fresh"), "run", policy=FAST)


def test_pull_of_a_run_the_store_does_not_have_says_so(tmp_path):
    with pytest.raises(SnapshotError, match="no snapshot"):
        sync.pull(MemoryStore("empty"), LocalStore(tmp_path), "nope")


def test_a_conflicting_manifest_for_the_same_step_is_never_overwritten(local):
    remote = MemoryStore("conflict")
    take(local, 7, {"w": torch.zeros(10)})
    sync.push(local, remote, "run", policy=FAST)
    before = remote.get(fmt.manifest_key("run", 7))
    other = LocalStore(local.root.parent / "other")
    take(other, 7, {"w": torch.ones(10)})
    transfer = sync.push(other, remote, "run", policy=FAST)[0]
    assert transfer.manifest == "present"
    assert remote.get(fmt.manifest_key("run", 7)) == before


def test_a_push_leaves_no_upload_marker_behind(local, remote):
    take(local, 4, frozen_backbone(1))
    sync.push(local, remote, "run")
    assert remote.list("run/uploads/") == []


def test_the_runs_environment_files_travel_with_its_snapshots(local, remote, tmp_path):
    take(local, 1, {"w": torch.zeros(4)})
    local.put("run/env/lock.json", b'{"lock": 1}')
    sync.push(local, remote, "run")
    fresh = LocalStore(tmp_path / "fresh")
    sync.pull(remote, fresh, "run")
    assert fresh.get("run/env/lock.json") == b'{"lock": 1}'


def test_push_and_pull_work_over_sftp(local, sshd, tmp_path):
    remote = open_store(sshd.url(), ssh_config=str(sshd.config))
    tensors = frozen_backbone(3)
    take(local, 9, tensors)
    sync.push(local, remote, "run")
    fresh = LocalStore(tmp_path / "fresh")
    sync.pull(remote, fresh, "run")
    loaded = load_tensors(fresh, reader.read_manifest(fresh, "run"))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_pushing_several_snapshots_reports_one_total_that_the_bar_reaches(local, remote):
    for step in (1, 2, 3):
        take(local, step, {"frozen": torch.zeros(4000), "w": torch.full((1000,), float(step))})
    reports: list[tuple[int, int]] = []
    transfers = sync.push(local, remote, "run", every=True,
                          progress=lambda n, total: reports.append((n, total)))
    totals = {total for _n, total in reports}
    moved = sum(t.bytes_sent + t.bytes_skipped for t in transfers)
    assert totals == {moved}
    assert sum(n for n, _total in reports) == moved


def test_a_corrupt_blob_sent_in_parts_is_refused_and_never_becomes_visible(local, request,
                                                                           monkeypatch):
    aws_env(monkeypatch)
    server = request.getfixturevalue("seaweed")
    remote = open_store(server.url(), **server.options(part_size=5 << 20))
    manifest = take(local, 1, {"w": torch.randn(6 << 18)})  # 6 MiB: two parts
    digest = next(iter(manifest["blobs"]))
    path = local.root / fmt.blob_key("run", digest)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last part's bytes: the check runs while the first is sent
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="corrupt"):
        sync.push(local, remote, "run", policy=FAST)
    assert remote.size(fmt.blob_key("run", digest)) is None
    pending = remote.client.list_multipart_uploads(Bucket=remote.bucket).get("Uploads", [])
    assert not [u for u in pending if digest in u["Key"]]

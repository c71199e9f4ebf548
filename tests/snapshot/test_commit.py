"""The one commit protocol: complete or invisible, and who wins when a step is written twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from burst.snapshot import format as fmt
from burst.snapshot import reader, sync
from burst.snapshot.tensors import load_tensors
from burst.store import LocalStore, MemoryStore, TransientStoreError
from burst.store.retry import RetryPolicy
from tests.helpers.snapshot_helpers import take

FAST = RetryPolicy(attempts=3, base=0.001, cap=0.001)


def test_a_second_commit_of_a_step_in_the_tier_stores_the_newest_reason(tmp_path):
    """An OOM snapshot at the step a periodic one holds: resume planning reads the reason."""
    store = LocalStore(tmp_path)
    take(store, 5, {"w": torch.ones(8)})
    take(store, 5, {"w": torch.ones(8)}, reason="oom")
    assert reader.list_steps(store, "run") == [5]
    assert reader.verify(store, "run", 5)["reason"] == "oom"


class BlobWritesFail(LocalStore):
    def put(self, key, data):
        if "/blobs/" in key:
            raise OSError("disk full")
        super().put(key, data)


def test_a_failed_commit_leaves_the_previous_snapshot_of_that_step_intact(tmp_path):
    take(LocalStore(tmp_path), 3, {"w": torch.zeros(8)})
    with pytest.raises(OSError, match="disk full"):
        take(BlobWritesFail(tmp_path), 3, {"w": torch.ones(8)}, reason="signal")
    store = LocalStore(tmp_path)
    manifest = reader.verify(store, "run", 3)
    assert manifest["reason"] == "periodic"
    assert torch.equal(load_tensors(store, manifest)["w"], torch.zeros(8))


class AnswerLost(MemoryStore):
    """A remote whose first manifest write lands but whose answer never arrives."""

    lost = False

    def put_if_absent(self, key, data):
        landed = super().put_if_absent(key, data)
        if "/snapshots/" in key and not self.lost:
            self.lost = True
            raise TransientStoreError("connection reset after the request was sent")
        return landed


def test_a_retried_manifest_write_that_had_landed_leaves_one_complete_snapshot(tmp_path):
    local = LocalStore(tmp_path)
    take(local, 2)
    remote = AnswerLost("answer-lost")
    transfer = sync.push(local, remote, "run", policy=FAST)[0]
    assert transfer.manifest == "present"  # the retry found the first attempt's manifest
    assert remote.get(fmt.manifest_key("run", 2)) == local.get(fmt.manifest_key("run", 2))
    assert reader.verify(remote, "run")["step"] == 2 and remote.list("run/uploads/") == []


def test_a_pull_puts_the_stores_copy_of_a_step_in_place_of_the_tiers(tmp_path):
    remote, tier = MemoryStore("pull-replaces"), LocalStore(tmp_path)
    take(remote, 7, {"w": torch.ones(8)})
    take(tier, 7, {"w": torch.zeros(8)})
    sync.pull(remote, tier, "run", policy=FAST)
    assert torch.equal(load_tensors(tier, reader.verify(tier, "run", 7))["w"], torch.ones(8))
    assert tier.list("run/uploads/") == []


def test_listing_verifying_collecting_and_moving_snapshots_never_import_torch(tmp_path):
    take(LocalStore(tmp_path / "src"), 1)
    take(LocalStore(tmp_path / "src"), 2)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any "import torch" now fails
        from burst.snapshot import catalog, reader, retention, sync
        from burst.store import LocalStore
        src, dst = LocalStore({str(tmp_path / "src")!r}), LocalStore({str(tmp_path / "dst")!r})
        assert [r["step"] for r in catalog.snapshot_rows(src, "run")] == [1, 2]
        reader.verify(src, "run", 1)
        sync.push(src, dst, "run", every=True)
        sync.pull(dst, LocalStore({str(tmp_path / "back")!r}), "run")
        assert retention.gc(dst, "run", keep_last=1).dropped == [1]
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr

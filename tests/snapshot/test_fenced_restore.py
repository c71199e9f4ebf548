"""A fenced writer relaunched on its machine never restores its own refused snapshot:
the fence decides which snapshots of the local tier count, and says why one is skipped."""

from __future__ import annotations

import pytest
import torch

import burst
from burst import events
from burst.errors import BurstError
from burst.snapshot import reader
from burst.store import LocalStore, open_store
from tests.helpers.store_servers import aws_env
from tests.snapshot.test_lineage_run import train


@pytest.fixture
def remote_url(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("BURST_FREEZE", "0")
    return moto_s3.url()


def launch(url: str, local) -> tuple[burst.Run, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run("r", global_batch=4, micro_batch=2, store=url, local=local,
                    persist_seconds=None)
    run.attach(model, optimizer)
    return run, model, optimizer


def test_a_fenced_writer_relaunched_restores_the_newest_snapshot_the_fence_accepts(
        remote_url, tmp_path):
    here = tmp_path / "laptop"
    a, model_a, opt_a = launch(remote_url, here)  # generation 1
    train(a, model_a, opt_a, steps=2)
    a.snapshot(wait=True)
    node, _, _ = launch(remote_url, tmp_path / "node")  # generation 2: the burst's node
    assert node.restored is not None and node.restored.step == 2
    train(a, model_a, opt_a, steps=1)  # the laptop trains on, unaware
    with pytest.raises(BurstError):
        a.snapshot(wait=True)  # in its local tier; the store's fence refuses it
    local = LocalStore(here)
    assert reader.list_steps(local, "r") == [2, 3]
    assert reader.list_steps(open_store(remote_url), "r") == [2]

    again, _, _ = launch(remote_url, here)  # the laptop relaunched: generation 3
    assert again.restored is not None and again.restored.step == 2
    skipped = [e["message"] for e in events.read(local, "r")
               if e.get("event") == "snapshot-skipped"]
    assert any("r@3" in m and "generation 1" in m and "generation 2" in m for m in skipped)


def test_a_restart_with_no_launch_between_keeps_its_own_newer_snapshot(remote_url, tmp_path):
    here = tmp_path / "laptop"
    a, model_a, opt_a = launch(remote_url, here)
    train(a, model_a, opt_a, steps=2)
    a.snapshot(wait=True)
    again, _, _ = launch(remote_url, here)  # a restart on the same machine: no burst
    assert again.restored is not None and again.restored.step == 2
    assert not [e for e in events.read(LocalStore(here), "r")
                if e.get("event") == "snapshot-skipped"]

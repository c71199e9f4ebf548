"""A Run with a remote store: commits locally, uploads in the background, resumes elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst.snapshot import reader, sync
from burst.snapshot import tiers as snapshot
from burst.store import LocalStore, open_store
from tests.helpers.store_servers import aws_env

DATA = TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20))


def train(run: burst.Run, model, optimizer, steps: int) -> None:
    loader = DataLoader(DATA, batch_size=run.micro_batch,
                        sampler=burst.ResumableSampler(DATA, seed=1))
    for _ in run.epochs(1):
        for step in run.steps(loader):
            for x, _y in step:
                (model(x).sum() * step.weight(len(x))).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step.index == steps:
                return


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture
def remote_url(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    return moto_s3.url()


def test_a_run_on_a_remote_store_uploads_and_resumes_on_a_fresh_machine(remote_url, tmp_path):
    run = burst.Run("r", global_batch=4, store=remote_url, local=tmp_path / "node1")
    model, opt = model_and_optimizer()
    run.attach(model, opt)
    train(run, model, opt, steps=3)
    run.close()
    remote = open_store(remote_url)
    assert reader.list_steps(remote, "r") == [3]
    assert reader.list_steps(LocalStore(tmp_path / "node1"), "r") == [3]
    again = burst.Run("r", global_batch=4, store=remote_url, local=tmp_path / "node2")
    model2, opt2 = model_and_optimizer()
    report = again.attach(model2, opt2)
    assert report is not None and report.step == 3
    assert torch.equal(model2.weight, model.weight)


def test_a_snapshot_a_crash_left_un_uploaded_goes_up_when_the_run_restarts(remote_url,
                                                                            tmp_path):
    node = tmp_path / "node"
    run = burst.Run("c", global_batch=4, store=str(node))  # as if the upload never happened
    model, opt = model_and_optimizer()
    run.attach(model, opt)
    train(run, model, opt, steps=2)
    run.close()
    restarted = burst.Run("c", global_batch=4, store=remote_url, local=node)
    restarted.flush(30)
    assert reader.list_steps(open_store(remote_url), "c") == [2]


KILLED_PUSH = textwrap.dedent("""
    import sys, time
    from burst.snapshot import sync
    from burst.store import open_store
    local, remote = open_store(sys.argv[1]), open_store(sys.argv[2])
    real_put = remote.put
    def slow_put(key, data):
        real_put(key, data)
        print("landed", key, flush=True)
        time.sleep(0.5)  # a slow link: the test kills us between blobs
    remote.put = slow_put
    sync.push(local, remote, "k")
""")


@pytest.mark.e2e
def test_a_killed_upload_resumes_without_resending_verified_blobs(seaweed, tmp_path,
                                                                  monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("AWS_CA_BUNDLE", seaweed.ca_bundle)
    local = LocalStore(tmp_path / "local")
    tensors = {f"t{i}": torch.randn(300_000) for i in range(6)}
    manifest = snapshot.write_snapshot(local, "k", snapshot.Captured(
        1, {}, tensors, {"reason": "periodic"}))
    url = seaweed.url()
    process = subprocess.Popen([sys.executable, "-c", KILLED_PUSH, str(local.root), url],
                               stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    landed = 0
    deadline = time.monotonic() + 60
    while landed < 3 and time.monotonic() < deadline:
        line = process.stdout.readline()
        landed += "/blobs/" in line
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    remote = open_store(url)
    assert reader.list_steps(remote, "k") == []  # nothing visible from the killed upload
    resumed = sync.push(local, remote, "k")[0]
    assert resumed.blobs_skipped >= 3 and resumed.blobs_sent == len(manifest["blobs"]) - \
        resumed.blobs_skipped
    reader.verify(remote, "k")

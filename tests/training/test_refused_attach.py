"""A refused ``Run.attach`` leaves the process as it found it: signal handlers, the
excepthook, threads and hooks are what they were before the attach."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from torch.utils.data import TensorDataset

import burst
from burst.contract import ENV_METADATA_URL, Exit
from burst.errors import BurstError
from burst.snapshot import format as fmt
from burst.snapshot import reader
from burst.store import LocalStore
from burst.training import preemption

DATA = TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20))
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def process_state() -> dict:
    """What a refused attach must leave as it was (threads: compared by :func:`started`,
    since an earlier test's background thread may end meanwhile)."""
    return {"signals": {s: signal.getsignal(s) for s in SIGNALS},
            "excepthook": sys.excepthook, "threading.excepthook": threading.excepthook}


def started(before: set[threading.Thread]) -> list[str]:
    """The threads alive now that were not before."""
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


@pytest.fixture(autouse=True)
def quiet_process(monkeypatch):
    monkeypatch.setenv("BURST_FREEZE", "0")
    # the preemption watcher starts (a dead metadata address: it polls, finds nothing)
    monkeypatch.setenv(preemption.ENV_PROVIDER, "aws")
    monkeypatch.setenv(ENV_METADATA_URL, "http://127.0.0.1:9")
    monkeypatch.setenv(preemption.ENV_POLL, "0.2")


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def saved_run(store_dir, global_batch: int = 4) -> None:
    """A run with one snapshot at step 0 (taken by a launch that then closed)."""
    run = burst.Run("r", global_batch=global_batch, store=store_dir, persist_seconds=None)
    model, optimizer = model_and_optimizer()
    run.attach(model, optimizer, sampler=burst.ResumableSampler(DATA, seed=1))
    run.close()


def assert_refusal_leaves_process_as_found(run: burst.Run, refusal, **attach) -> None:
    model, optimizer = model_and_optimizer()
    before, threads = process_state(), set(threading.enumerate())
    with pytest.raises(refusal):
        run.attach(model, optimizer, **attach)
    assert process_state() == before
    assert started(threads) == []
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


def test_a_snapshot_of_another_global_batch_refuses_and_undoes_the_attach(store_dir):
    saved_run(store_dir, global_batch=4)
    run = burst.Run("r", global_batch=8, store=store_dir, persist_seconds=None)
    assert_refusal_leaves_process_as_found(run, BurstError)


def test_a_sampler_over_other_data_refuses_and_undoes_the_attach(store_dir):
    saved_run(store_dir)
    run = burst.Run("r", global_batch=4, store=store_dir, persist_seconds=None)
    other = TensorDataset(torch.zeros(12, 2), torch.zeros(12))
    assert_refusal_leaves_process_as_found(run, BurstError,
                                           sampler=burst.ResumableSampler(other, seed=1))


def test_a_corrupt_snapshot_refuses_and_undoes_the_attach(store_dir):
    saved_run(store_dir)
    store = LocalStore(store_dir)
    manifest = reader.read_manifest(store, "r")
    for digest in manifest["blobs"]:
        path = store.root / fmt.blob_key("r", digest)
        path.write_bytes(b"\0" * path.stat().st_size)
    run = burst.Run("r", global_batch=4, store=store_dir, persist_seconds=None)
    assert_refusal_leaves_process_as_found(run, BurstError)


def test_a_launch_replaced_before_it_attached_stops_and_undoes_the_attach(store_dir):
    replaced = burst.Run("r", global_batch=4, store=store_dir, persist_seconds=None)
    newer = burst.Run("r", global_batch=4, store=store_dir, persist_seconds=None)
    model, optimizer = model_and_optimizer()
    before, threads = process_state(), set(threading.enumerate())
    with pytest.raises(SystemExit) as stopped:
        replaced.attach(model, optimizer)
    assert stopped.value.code == Exit.FENCED
    assert process_state() == before
    assert started(threads) == []
    assert newer.lineage.generation > replaced.lineage.generation


def test_a_successful_attach_after_a_refused_one_installs_the_guard_once(store_dir):
    saved_run(store_dir)
    run = burst.Run("r", global_batch=4, store=store_dir, persist_seconds=None)
    before = signal.getsignal(signal.SIGTERM)
    model, optimizer = model_and_optimizer()
    with pytest.raises(BurstError):
        run.attach(model, optimizer, sampler=burst.ResumableSampler(
            TensorDataset(torch.zeros(12, 2), torch.zeros(12)), seed=1))
    run.attach(model, optimizer)
    assert signal.getsignal(signal.SIGTERM) != before
    run.close()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_refused_setting_leaves_no_audit_hook_recording(store_dir):
    """In a fresh process: other runs of this one may still be recording."""
    script = textwrap.dedent(f"""
        import burst
        from burst.errors import ConfigError
        from burst.inputs import recorder
        try:
            burst.Run("r", global_batch=4, store={str(store_dir)!r}, overhead_budget=2)
        except ConfigError:
            print("refused", recorder.recording())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["refused", "False"], done.stderr

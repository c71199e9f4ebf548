"""Two runs in one process, one after the other (a notebook): the second never ships what
the first read, and a closed run leaves the process's audit hook muted."""

from __future__ import annotations

import threading

import torch

import burst
from burst.inputs import part, recorder


def train(run: burst.Run, read: list) -> None:
    model = torch.nn.Linear(2, 1)
    run.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for path in read:
        path.read_bytes()
    run.close()


def background_staging_done() -> None:
    """The first run's last staging (a thread hashing what it read) holds those files
    open a while after close; the process's open files are part of what a run read."""
    for thread in threading.enumerate():
        if thread.name == "burst-inputs":
            thread.join(timeout=120)


def test_a_closed_run_leaves_nothing_recording(tmp_path, dataset):
    train(burst.Run("first", global_batch=4, store=tmp_path / "store"),
          [dataset / "docs" / "doc0.txt"])
    assert not recorder.recording()


def test_a_later_run_does_not_ship_what_an_earlier_run_read(tmp_path, dataset):
    train(burst.Run("first", global_batch=4, store=tmp_path / "store"), [dataset / "tokens.bin"])
    background_staging_done()
    second = burst.Run("second", global_batch=4, store=tmp_path / "store")
    model = torch.nn.Linear(2, 1)
    second.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    (dataset / "docs" / "doc1.txt").read_bytes()
    chosen = part.registered(second.store, "second").selection(second.store)
    files = {f for root in chosen.roots for f in root.files}
    second.close()
    assert str(dataset / "docs" / "doc1.txt") in files
    assert str(dataset / "tokens.bin") not in files

"""The failure handling of a run used as a context manager (``with burst.Run(...) as run``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from burst.env import lockfile
from burst.snapshot import reader
from burst.snapshot.tensors import load_tensors
from burst.store import LocalStore

PROGRAM = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, TensorDataset
    import burst

    if len(sys.argv) > 4:  # a loaded machine: the environment freeze takes this long
        from burst.env import lockfile
        build = lockfile.build
        def slow_build(*args, **kwargs):
            time.sleep(float(sys.argv[4]))
            return build(*args, **kwargs)
        lockfile.build = slow_build

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with burst.Run("guarded", store=sys.argv[1], global_batch=8, micro_batch=4,
                   shadow_every=int(sys.argv[2]), persist_seconds=None) as run:
        run.attach(model, opt)
        loader = DataLoader(data, batch_size=run.micro_batch,
                            sampler=burst.ResumableSampler(data, seed=0))
        for epoch in run.epochs(1):
            for step in run.steps(loader):
                if step.index == int(sys.argv[3]):  # the program's own error, not a drill
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (the program's)")
                for x, y in step:
                    loss = torch.nn.functional.mse_loss(model(x), y) * step.weight(len(x))
                    loss.backward()
                opt.step()
                opt.zero_grad()
    print("finished")
""")


def run_program(tmp_path, fault: str, shadow_every: int = 100, raise_at: int = 0,
                freeze_seconds: float | None = None) -> subprocess.CompletedProcess:
    """``freeze_seconds``: freeze the run's environment (off otherwise), this slowly."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    slow = [] if freeze_seconds is None else [str(freeze_seconds)]
    return subprocess.run([sys.executable, str(script), str(tmp_path / "store"),
                           str(shadow_every), str(raise_at), *slow],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "BURST_FAULT": fault,
                               "BURST_FREEZE": "0" if freeze_seconds is None else "env"})


def test_an_oom_inside_the_with_block_snapshots_the_last_boundary_and_exits_86(tmp_path):
    done = run_program(tmp_path, "oom@3:1")
    assert done.returncode == 86, done.stderr
    assert "Traceback" not in done.stderr and "finished" not in done.stdout
    manifest = reader.read_manifest(LocalStore(tmp_path / "store"), "guarded")
    assert manifest["step"] == 2 and manifest["reason"] == "oom"


def test_an_oom_before_the_environment_freeze_is_done_still_leaves_the_lockfile(tmp_path):
    """The README's drill on a loaded machine: the OOM came before the background freeze
    had stored the lockfile, the process exited at once, and `burst resume` then refused
    the snapshot it had just been told to resume."""
    done = run_program(tmp_path, "oom@3:1", freeze_seconds=4.0)
    assert done.returncode == 86, done.stderr
    store = LocalStore(tmp_path / "store")
    assert reader.read_manifest(store, "guarded")["reason"] == "oom"
    assert store.size(lockfile.latest_key("guarded")), done.stderr


def test_the_oom_snapshot_holds_the_batchnorm_statistics_of_the_boundary(tmp_path):
    """The failed step's first micro-batch ran forward (moving BatchNorm's running mean);
    the snapshot must still hold the values of the end of step 2."""
    run_program(tmp_path / "a", "oom@3:1")
    run_program(tmp_path / "b", "oom@3:0")  # fails before any forward of step 3
    import torch

    means = []
    for side in ("a", "b"):
        store = LocalStore(tmp_path / side / "store")
        tensors = load_tensors(store, reader.read_manifest(store, "guarded"))
        means.append(next(t for name, t in tensors.items() if name.endswith("running_mean")))
    assert torch.equal(means[0], means[1])


def test_a_cuda_oom_where_cuda_was_never_used_exits_86_with_the_ram_shadow(tmp_path):
    """No step boundary is marked where nothing can raise a CUDA OOM (but a drill); one
    raised anyway (here by the program) keeps the RAM shadow and says so."""
    done = run_program(tmp_path, "", shadow_every=2, raise_at=4)
    assert done.returncode == 86, done.stderr
    assert "snapshot of step 2 from the RAM shadow" in done.stderr
    manifest = reader.read_manifest(LocalStore(tmp_path / "store"), "guarded")
    assert manifest["step"] == 2 and manifest["reason"] == "oom"


def test_a_sticky_error_inside_the_with_block_exits_87_with_the_ram_shadow(tmp_path):
    done = run_program(tmp_path, "sticky@3", shadow_every=1)
    assert done.returncode == 87, done.stderr
    manifest = reader.read_manifest(LocalStore(tmp_path / "store"), "guarded")
    assert manifest["reason"] == "gpu-failure" and manifest["step"] == 2


def test_a_sticky_error_before_any_ram_copy_says_nothing_newer_could_be_saved(tmp_path):
    done = run_program(tmp_path, "sticky@3")
    assert done.returncode == 87, done.stderr
    assert "no RAM copy yet" in done.stderr
    assert reader.read_manifest(LocalStore(tmp_path / "store"), "guarded") is None

"""Failure records: each rank that leaves through the guard says how in
``$BURST_FAILURE_DIR/rank-<rank>.json``, because a launcher may not pass its exit code on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from burst.contract import ENV_FAILURE_DIR, Exit
from burst.training import failure
from tests.conftest import run_example


def _records_after(tmp_path: Path, fault: str) -> tuple[subprocess.CompletedProcess, Path]:
    records = tmp_path / "failures"
    records.mkdir()
    done = run_example(tmp_path, "recorded", "--epochs", "1",
                       env={"BURST_FAULT": fault, ENV_FAILURE_DIR: str(records),
                            "BURST_FREEZE": "0"})
    return done, records


def test_a_real_oom_leaves_an_oom_record_with_exit_code_86(tmp_path):
    done, records = _records_after(tmp_path, "oom@3")
    assert done.returncode == Exit.OOM, done.stderr
    record = json.loads((records / "rank-0.json").read_text())
    assert record["kind"] == "oom" and record["exit_code"] == 86
    assert record["rank"] == 0 and record["step"] == 3 and record["pid"] > 0


def test_a_sticky_gpu_error_leaves_a_gpu_failure_record_with_exit_code_87(tmp_path):
    done, records = _records_after(tmp_path, "sticky@2")
    assert done.returncode == Exit.GPU_FAILURE, done.stderr
    [record] = failure.read_records(records)
    assert (record["kind"], record["exit_code"], record["step"]) == ("gpu-failure", 87, 2)


def test_a_sigterm_stop_at_a_step_boundary_leaves_a_signal_record_with_exit_code_88(tmp_path):
    done, records = _records_after(tmp_path, "term@2")
    assert done.returncode == Exit.STOPPED, done.stderr
    [record] = failure.read_records(records)
    assert (record["kind"], record["exit_code"], record["step"]) == ("signal", 88, 2)


STUCK_PROGRAM = textwrap.dedent("""
    import os, signal, sys, time, torch
    import burst

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run("stuck", store=sys.argv[1], global_batch=1, grace_seconds=1.0,
                    persist_seconds=None)
    run.attach(model, opt)
    run.begin_step()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # a step that never ends: only the grace-period watchdog gets out
    print("slept through")
""")


def test_the_grace_period_watchdog_leaves_a_signal_record_with_exit_code_88(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_PROGRAM)
    records = tmp_path / "failures"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, ENV_FAILURE_DIR: str(records),
                               "BURST_FREEZE": "0"})
    assert done.returncode == Exit.STOPPED, done.stderr
    assert "slept through" not in done.stdout
    [record] = failure.read_records(records)
    assert (record["kind"], record["exit_code"], record["step"]) == ("signal", 88, 0)


def test_without_the_variable_no_record_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_FAILURE_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert failure.write_record("oom", 86, step=3, rank=0) is None
    assert list(tmp_path.iterdir()) == []


def test_write_record_replaces_the_ranks_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path))
    failure.write_record("signal", 88, step=4, rank=1)
    path = failure.write_record("oom", 86, step=5, rank=1, detail="second failure")
    assert path == tmp_path / "rank-1.json"
    assert [p.name for p in tmp_path.iterdir()] == ["rank-1.json"]
    record = json.loads(path.read_text())
    assert (record["kind"], record["step"], record["detail"]) == ("oom", 5, "second failure")


def test_write_record_into_an_unwritable_place_returns_none_instead_of_raising(
        tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV_FAILURE_DIR, str(blocker / "records"))
    assert failure.write_record("oom", 86, step=1, rank=0) is None


def test_read_records_skips_a_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path))
    failure.write_record("gpu-failure", 87, step=7, rank=1)
    (tmp_path / "rank-0.json").write_text('{"kind": "oom", "exit_co')  # torn by hand
    records = failure.read_records(tmp_path)
    assert [(r["rank"], r["kind"]) for r in records] == [(1, "gpu-failure")]


def test_read_records_sorts_by_rank_numerically(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path))
    for rank in (10, 2, 0):
        failure.write_record("oom", 86, step=1, rank=rank)
    assert [r["rank"] for r in failure.read_records(tmp_path)] == [0, 2, 10]


@pytest.mark.parametrize("content", ["[1, 2]", '{"kind": "oom"}', "\xff\xfe"])
def test_read_records_skips_a_file_that_is_not_a_record(tmp_path, content):
    (tmp_path / "rank-0.json").write_text(content, encoding="latin-1")
    assert failure.read_records(tmp_path) == []

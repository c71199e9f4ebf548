"""A store that fails while the training does not: one line that says what happened and
where the snapshots are, and an exit code of its own, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import burst
from burst.contract import Exit
from burst.snapshot import reader
from burst.store import open_store, retry
from tests.helpers.fault_proxy import FaultProxy, start
from tests.helpers.store_servers import aws_env, free_port

START = """
import os, sys, torch, burst
from burst.store import open_store
store = open_store("s3://bucket/runs", endpoint_url=sys.argv[1])
run = burst.Run("outage", store=store, local=sys.argv[2], global_batch=2)
print("trained", flush=True)
"""


def test_a_run_started_while_its_store_is_unreachable_stops_in_one_line(
        tmp_path, monkeypatch) -> None:
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_FREEZE", "0")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run([sys.executable, "-c", START, dead, str(tmp_path / "tier")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == Exit.STORE_UNREACHABLE, done.stderr
    assert "trained" not in done.stdout and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach" in lines[0] and "nothing was trained" in lines[0]


def test_close_when_only_uploads_fail_says_training_finished_and_where_the_snapshot_is(
        tmp_path, moto_s3, monkeypatch, capsys) -> None:
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_FREEZE", "0")
    monkeypatch.setattr(retry.RetryPolicy, "delay", lambda self, attempt, rng=None: 0.0)
    proxy = FaultProxy(moto_s3.endpoint, moto_s3.ca_bundle)
    server, endpoint = start(proxy)
    try:
        store = open_store(moto_s3.url(), **moto_s3.options(endpoint_url=endpoint))
        tier = tmp_path / "tier"
        run = burst.Run("outage", store=store, local=str(tier), global_batch=2,
                        persist_seconds=None)
        run.attach(torch.nn.Linear(2, 2))
        run.step = 3  # trained
        proxy.add("500", "PUT", times=None)  # the store stops taking uploads
        with pytest.raises(SystemExit) as exited:
            run.close()
    finally:
        server.shutdown()
        server.server_close()
    assert exited.value.code == Exit.UPLOAD_FAILED
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "upload failed" in line]
    assert len(said) == 1 and said[0].startswith("burst: training finished"), err
    assert "Traceback" not in err
    assert "training finished at step 3" in said[0] and str(tier) in said[0]
    assert "upload failed" in said[0] and "burst push outage" in said[0]
    assert reader.list_steps(run.local, "outage")[-1] == 3  # kept locally


def test_a_store_unreachable_at_start_leaves_a_record_the_agent_reads_under_torchrun(
        tmp_path, monkeypatch) -> None:
    from burst.contract import ENV_FAILURE_DIR
    from burst.parallel.group import Group
    from burst.snapshot import lineage
    from burst.training import failure, outage

    aws_env(monkeypatch)
    monkeypatch.setattr(retry.RetryPolicy, "delay", lambda self, attempt, rng=None: 0.0)
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path / "records"))
    dead = open_store("s3://bucket/runs", endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SystemExit) as exited:
        outage.at_start(dead, "outage", lambda: lineage.take(dead, "outage"), Group())
    assert exited.value.code == Exit.STORE_UNREACHABLE
    [record] = failure.read_records(tmp_path / "records")
    assert (record["kind"], record["exit_code"], record["rank"]) == (
        "store-unreachable", Exit.STORE_UNREACHABLE, 0)


def test_an_upload_failed_at_close_leaves_a_record_the_agent_reads_under_torchrun(
        tmp_path, moto_s3, monkeypatch) -> None:
    from burst.contract import ENV_FAILURE_DIR
    from burst.training import failure

    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_FREEZE", "0")
    monkeypatch.setattr(retry.RetryPolicy, "delay", lambda self, attempt, rng=None: 0.0)
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path / "records"))
    proxy = FaultProxy(moto_s3.endpoint, moto_s3.ca_bundle)
    server, endpoint = start(proxy)
    try:
        store = open_store(moto_s3.url(), **moto_s3.options(endpoint_url=endpoint))
        run = burst.Run("outage", store=store, local=str(tmp_path / "tier"), global_batch=2,
                        persist_seconds=None)
        run.attach(torch.nn.Linear(2, 2))
        run.step = 3
        proxy.add("500", "PUT", times=None)
        with pytest.raises(SystemExit):
            run.close()
    finally:
        server.shutdown()
        server.server_close()
    [record] = failure.read_records(tmp_path / "records")
    assert (record["kind"], record["exit_code"], record["step"], record["rank"]) == (
        "upload-failed", Exit.UPLOAD_FAILED, 3, 0)


RANKS_START = """
import sys, burst
from burst.parallel import init_from_env
from burst.store import open_store
init_from_env()
store = open_store("s3://bucket/runs", endpoint_url=sys.argv[1])
run = burst.Run("outage", store=store, local=sys.argv[2], global_batch=2,
                micro_batch=1)
print("trained", flush=True)
"""


def two_ranks(script: str, *args: str, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """``script`` as rank 0 and rank 1 of one gloo group (torchrun's variables, set here so
    each rank's stderr is its own)."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                                   "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
             for rank in range(2)]
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done


@pytest.mark.e2e
def test_every_rank_of_a_run_started_while_its_store_is_unreachable_stops_in_one_line(
        tmp_path, monkeypatch) -> None:
    from burst.contract import ENV_FAILURE_DIR
    from burst.training import failure

    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_FREEZE", "0")
    monkeypatch.setenv(ENV_FAILURE_DIR, str(tmp_path / "records"))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ranks = two_ranks(RANKS_START, dead, str(tmp_path / "tier"), env=dict(os.environ))
    for done in ranks:
        assert done.returncode == Exit.STORE_UNREACHABLE, done.stderr
        assert "trained" not in done.stdout and "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "nothing was trained" in lines[0], done.stderr
    records = failure.read_records(tmp_path / "records")
    assert sorted((r["kind"], r["rank"]) for r in records) == [
        ("store-unreachable", 0), ("store-unreachable", 1)]

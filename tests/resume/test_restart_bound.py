"""burst bounds a managed job's restarts itself, counting node starts in the store.

SkyPilot recovers 87 and preemptions without counting them, so ``burst node run`` claims a
record per start (``<run>/restarts/<n>.json``, put_if_absent) and refuses to train past the
bound (end to end: ``test_restart_bound_e2e``). An OOM never reaches SkyPilot's recovery:
the node shrinks the micro-batch, then ends the job with 86.

The store is a real S3 server on loopback (moto); ``burst node run`` runs in-process with a
real agent supervising a real child process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from burst import events
from burst.launch.task import RECOVER_ON, SKYPILOT_MAX_RESTARTS
from burst.node import restarts
from burst.resume import node
from burst.store import open_store
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import aws_env

RUN = "bounded"


@pytest.fixture
def s3(moto_s3, monkeypatch, tmp_path) -> str:
    """A run with one small snapshot in S3, and a node's environment in a managed job."""
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("BURST_NODE_GPU", "cpu")
    monkeypatch.setenv("BURST_NODE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("SKYPILOT_TASK_ID", f"sky-managed-{tmp_path.name}_1-0")
    monkeypatch.setenv(restarts.MAX_RESTARTS_ENV, "0")
    url = f"{moto_s3.url()}/{tmp_path.name}"
    take(open_store(url), 4, run_id=RUN,
         batch={"global": 16, "micro": 8, "accumulation": 2, "world_size": 1})
    return url


def start_node(url: str, tmp_path: Path, exit_code: int, attempt: int) -> int:
    """One start of ``burst node run`` on a fresh node: the child appends to ``ran`` and
    exits ``exit_code``."""
    child = (f"import sys; open({str(tmp_path / 'ran')!r}, 'a').write('x'); "
             f"sys.exit({exit_code})")
    return node.run([sys.executable, "-c", child], RUN, url, python=sys.executable,
                    venv=tmp_path / "venv", local_dir=tmp_path / f"local-{attempt}",
                    say=lambda _m: None)


def named(url: str, name: str) -> list[dict]:
    return [e for e in events.read(open_store(url), RUN) if e["event"] == name]


def test_a_node_that_keeps_running_out_of_memory_shrinks_then_ends_the_job_with_86(s3,
                                                                                  tmp_path):
    assert start_node(s3, tmp_path, 86, 0) == 86
    assert 86 not in RECOVER_ON and SKYPILOT_MAX_RESTARTS == 0  # SkyPilot does not retry it
    actions = [e["action"] for e in named(s3, "policy")]
    assert actions == ["retry-smaller"] * 3 + ["stop"]  # the agent's own bound, then 86
    (end,) = named(s3, "node-exit")
    assert end["returncode"] == 86 and end["decision"] == "stop"


def test_restarts_are_counted_per_managed_job_and_rank(moto_s3, tmp_path, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    store = open_store(f"{moto_s3.url()}/{tmp_path.name}")

    def claim(task: str, rank: int = 0) -> restarts.Start | None:
        return restarts.claim(store, RUN, {"SKYPILOT_TASK_ID": task,
                                           "SKYPILOT_NODE_RANK": str(rank),
                                           restarts.MAX_RESTARTS_ENV: "1"})

    first, other_rank = claim("job-a"), claim("job-a", 1)
    assert [first.restarts, other_rank.restarts] == [0, 0]  # one attempt
    restarts.finish(store, RUN, first, 87)  # a GPU failure: an error
    second = claim("job-a")
    restarts.finish(store, RUN, second, 87)
    third = claim("job-a")
    assert (second.errors, second.over, third.errors, third.over) == (1, False, 2, True)
    assert claim("job-b").restarts == 0  # a new resume is a new managed job
    assert len(store.list(restarts.prefix(RUN))) == 7  # five starts, two ends
    assert restarts.claim(store, RUN, {"SKYPILOT_TASK_ID": "job-c"}) is None  # no bound


def test_preemptions_are_counted_apart_from_errors(moto_s3, tmp_path, monkeypatch):
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    store = open_store(f"{moto_s3.url()}/{tmp_path.name}")
    environ = {"SKYPILOT_TASK_ID": "spot", restarts.MAX_RESTARTS_ENV: "0",
               restarts.MAX_PREEMPTIONS_ENV: "5"}
    for _ in range(4):  # four clean stops after a notice
        restarts.finish(store, RUN, restarts.claim(store, RUN, environ), 88)
    restarts.claim(store, RUN, environ)  # a fifth start that never ended: the machine went
    sixth = restarts.claim(store, RUN, environ)
    assert (sixth.preemptions, sixth.errors, sixth.over) == (5, 0, False)
    restarts.finish(store, RUN, sixth, 87)
    seventh = restarts.claim(store, RUN, environ)
    assert (seventh.preemptions, seventh.errors) == (5, 1)
    assert "over the bound of 0 (--max-restarts)" in seventh.why


def test_a_preemption_budget_in_hours_stops_a_job_preempted_past_it(tmp_path):
    store = open_store(str(tmp_path / "store"))
    environ = {"SKYPILOT_TASK_ID": "old", restarts.MAX_RESTARTS_ENV: "0",
               restarts.PREEMPTION_HOURS_ENV: "2"}
    store.put(restarts.record_key(RUN, 0),
              b'{"task_id": "old", "rank": 0, "time": "2020-01-01T00:00:00.000+00:00"}')
    start = restarts.claim(store, RUN, environ)
    assert start.preemptions == 1 and start.hours > 2
    assert "over the budget of 2 h (--preemption-hours)" in start.why

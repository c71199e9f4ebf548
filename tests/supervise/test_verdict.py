"""How an attempt ended, from its ranks' failure records first and its exit status only
where none was left: torchrun's exit 1 over a rank's OOM record is an OOM, and the agent
(and so ``burst node run``) exits with burst's 86, not torchrun's 1.

The records are written by the library's own writer (``failure.write_record``), in a
real child process where the agent is involved."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from burst import events
from burst.contract import ENV_FAILURE_DIR, Exit
from burst.store import LocalStore
from burst.supervise import verdict
from burst.supervise.agent import Agent, Policy
from burst.training import failure


def write(directory: Path, monkeypatch: pytest.MonkeyPatch, kind: str, code: int,
          rank: int) -> None:
    monkeypatch.setenv(ENV_FAILURE_DIR, str(directory))
    assert failure.write_record(kind, code, step=5, rank=rank) is not None


def test_torchruns_exit_1_with_a_rank_record_of_86_is_an_oom(tmp_path, monkeypatch):
    write(tmp_path, monkeypatch, "oom", Exit.OOM, rank=1)
    judged = verdict.judge(1, failure.read_records(tmp_path))
    assert (judged.kind, judged.code, judged.rank, judged.returncode) == ("oom", 86, 1, 1)
    assert judged.source == "record"


def test_a_gpu_failure_on_any_rank_outranks_an_oom(tmp_path, monkeypatch):
    write(tmp_path, monkeypatch, "oom", Exit.OOM, rank=0)
    write(tmp_path, monkeypatch, "gpu-failure", Exit.GPU_FAILURE, rank=3)
    judged = verdict.judge(1, failure.read_records(tmp_path))
    assert (judged.kind, judged.code, judged.rank) == ("gpu-failure", 87, 3)


def test_an_oom_outranks_the_signal_stops_of_the_ranks_torchrun_terminated(tmp_path,
                                                                           monkeypatch):
    write(tmp_path, monkeypatch, "signal", Exit.STOPPED, rank=0)
    write(tmp_path, monkeypatch, "oom", Exit.OOM, rank=1)
    write(tmp_path, monkeypatch, "signal", Exit.STOPPED, rank=2)
    judged = verdict.judge(1, failure.read_records(tmp_path))
    assert (judged.kind, judged.code, judged.rank) == ("oom", 86, 1)
    assert "rank 1 recorded oom (exit 86) of 3 record(s)" in judged.describe()


@pytest.mark.parametrize(("kind", "code"), [("upload-failed", Exit.UPLOAD_FAILED),
                                             ("store-unreachable", Exit.STORE_UNREACHABLE)])
def test_rank_0_s_store_ending_outranks_the_signal_stops_of_the_other_ranks(
        tmp_path, monkeypatch, kind, code):
    write(tmp_path, monkeypatch, kind, code, rank=0)
    write(tmp_path, monkeypatch, "signal", Exit.STOPPED, rank=1)
    judged = verdict.judge(1, failure.read_records(tmp_path))
    assert (judged.kind, judged.code, judged.rank) == (kind, code, 0)


def test_among_equal_kinds_the_lowest_rank_decides(tmp_path, monkeypatch):
    write(tmp_path, monkeypatch, "oom", Exit.OOM, rank=2)
    write(tmp_path, monkeypatch, "oom", Exit.OOM, rank=1)
    assert verdict.judge(1, failure.read_records(tmp_path)).rank == 1


def test_without_records_the_exit_status_decides(tmp_path):
    killed = verdict.judge(-signal.SIGKILL, verdict.read(tmp_path))
    assert (killed.kind, killed.code, killed.rank, killed.source) == (
        "killed", -signal.SIGKILL, None, "exit-status")
    assert verdict.judge(Exit.OOM, []).kind == "oom"
    assert verdict.judge(1, []).kind == "error"


def test_a_clean_exit_is_a_success_whatever_was_recorded(tmp_path, monkeypatch):
    write(tmp_path, monkeypatch, "signal", Exit.STOPPED, rank=0)
    assert verdict.judge(0, failure.read_records(tmp_path)).kind == "ok"


def test_each_attempt_gets_a_fresh_directory_that_is_removed_after(tmp_path):
    with verdict.record_directory() as first:
        (first / "rank-0.json").write_text("{}")
    with verdict.record_directory() as second:
        assert second != first and not list(second.iterdir())
    assert not first.exists() and not second.exists()
    assert verdict.read(first) == []


# A stand-in for torchrun over a rank that ran out of memory: the rank's record is written
# by the library's writer into $BURST_FAILURE_DIR, then the launcher exits 1.
LAUNCHER = ("import sys\n"
            "from burst.contract import Exit\n"
            "from burst.training import failure\n"
            "failure.write_record('oom', Exit.OOM, step=4, rank=1, detail='test')\n"
            "sys.exit(1)\n")


def test_the_agent_exits_with_burst_s_code_when_the_launcher_says_1(tmp_path):
    store = LocalStore(tmp_path / "store")
    agent = Agent([sys.executable, "-c", LAUNCHER], run_id="r", store=store,
                  store_url=str(tmp_path / "store"),
                  policy=Policy(on_oom="stop"),
                  say=lambda _m: None)
    outcome = agent.run()
    assert outcome.returncode == Exit.OOM and outcome.decision == "stop"
    [attempt] = outcome.attempts
    assert (attempt.returncode, attempt.kind, attempt.rank) == (1, "oom", 1)
    exit_event = next(e for e in events.read(store, "r") if e["event"] == "child-exit")
    assert (exit_event["returncode"], exit_event["code"], exit_event["rank"]) == (1, 86, 1)
    assert exit_event["decided_by"] == "record"
    assert exit_event["records"] == [{"rank": 1, "kind": "oom", "exit_code": 86, "step": 4}]


def test_a_later_attempt_never_sees_an_earlier_attempt_s_records(tmp_path):
    """The first attempt records an OOM and exits 1; the retry exits 1 leaving nothing:
    a script error, not a second OOM."""
    marker = tmp_path / "ran-once"
    program = ("import sys\nfrom pathlib import Path\nfrom burst.training import failure\n"
               "from burst.contract import Exit\n"
               f"marker = Path({str(marker)!r})\n"
               "if not marker.exists():\n"
               "    marker.write_text('x')\n"
               "    failure.write_record('oom', Exit.OOM, step=4, rank=1)\n"
               "sys.exit(1)\n")
    store = LocalStore(tmp_path / "store")
    agent = Agent([sys.executable, "-c", program], run_id="r", store=store,
                  store_url=str(tmp_path / "store"), policy=Policy(on_oom="retry-smaller"),
                  env={"BURST_MICRO_BATCH": "4"},
                  say=lambda _m: None)
    events.record(store, "r", "failure", kind="oom", **{"global": 8, "micro": 4,
                                                         "world_size": 2})
    outcome = agent.run()
    assert [a.kind for a in outcome.attempts] == ["oom", "error"]
    assert outcome.returncode == 1 and outcome.decision == "error"
    assert outcome.attempts[1].micro_batch == 2

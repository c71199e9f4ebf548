"""The two endings that are the store's fault, not the training's (burst.training.outage),
as the agent handles them with real child processes and real stores on 127.0.0.1:

- 92, the store unreachable as the run started: nothing trained, nothing lost; started
  again after a wait, counted apart from the crash retries, and bounded all the same;
- 93, training finished but the final upload failed: never trained again; the agent
  uploads the local tier's snapshot itself (as ``burst push`` does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from burst import events
from burst.contract import ENV_LOCAL, Exit
from burst.snapshot import reader
from burst.store import LocalStore, open_store, retry
from burst.supervise import verdict
from burst.supervise.agent import Agent, Policy
from tests.helpers.store_servers import aws_env, free_port

# exits 92 (what burst.Run does when its store does not answer) until it has been started
# argv[2] times, then finishes; each start leaves a line in argv[1]
UNREACHABLE_UNTIL = ("import sys\nfrom pathlib import Path\nfrom burst.contract import Exit\n"
                     "starts = Path(sys.argv[1])\n"
                     "with starts.open('a') as f:\n    f.write('start\\n')\n"
                     "if len(starts.read_text().splitlines()) < int(sys.argv[2]):\n"
                     "    sys.exit(Exit.STORE_UNREACHABLE)\n")

# trains to step 3 with its snapshots in the local tier (argv[1]), then ends as a run whose
# final upload failed does (burst.training.outage.upload_failed)
TRAINED_NOT_UPLOADED = ("import sys, torch, burst\nfrom burst.contract import Exit\n"
                        "run = burst.Run('up', store=sys.argv[1], global_batch=2,\n"
                        "                persist_seconds=None)\n"
                        "run.attach(torch.nn.Linear(2, 2))\n"
                        "run.step = 3\nrun.close()\nsys.exit(Exit.UPLOAD_FAILED)\n")


# torchrun over two ranks whose final upload failed: rank 0 ends through the library's own
# burst.training.outage.upload_failed (its line, its record), rank 1 is stopped by a signal,
# and the launcher exits 1
TORCHRUN_UPLOAD_FAILED = ("import sys, torch, burst\n"
                          "from burst.contract import Exit\n"
                          "from burst.errors import StoreError\n"
                          "from burst.store import LocalStore, open_store\n"
                          "from burst.training import failure, outage\n"
                          "run = burst.Run('up', store=sys.argv[1], global_batch=2,\n"
                          "                persist_seconds=None)\n"
                          "run.attach(torch.nn.Linear(2, 2))\n"
                          "run.step = 3\nrun.close()\n"
                          "try:\n"
                          "    outage.upload_failed(LocalStore(sys.argv[1]), open_store(sys.argv[2]),\n"
                          "                         'up', 3, StoreError('503 Slow Down'))\n"
                          "except SystemExit:\n"
                          "    pass\n"
                          "failure.write_record('signal', Exit.STOPPED, step=3, rank=1)\n"
                          "sys.exit(1)\n")


def unreachable(tmp_path: Path, succeed_on: int, **policy: object) -> tuple[Agent, Path]:
    starts = tmp_path / "starts"
    agent = Agent([sys.executable, "-c", UNREACHABLE_UNTIL, str(starts), str(succeed_on)],
                  run_id="r", store=LocalStore(tmp_path / "store"),
                  store_url=str(tmp_path / "store"),
                  policy=Policy(store_wait=0.01, **policy),  # type: ignore[arg-type]
                  say=lambda _m: None)
    return agent, starts


def trained_not_uploaded(tmp_path: Path, store_url: str) -> Agent:
    tier = tmp_path / "tier"
    return Agent([sys.executable, "-c", TRAINED_NOT_UPLOADED, str(tier)], run_id="up",
                 store=LocalStore(tier), store_url=store_url, env={ENV_LOCAL: str(tier)},
                 say=lambda _m: None)


@pytest.fixture
def no_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    aws_env(monkeypatch)
    monkeypatch.setenv("BURST_FREEZE", "0")


def test_exit_92_and_93_are_store_endings_not_script_errors() -> None:
    assert verdict.judge(Exit.STORE_UNREACHABLE, []).kind == "store-unreachable"
    assert verdict.judge(Exit.UPLOAD_FAILED, []).kind == "upload-failed"


def test_a_store_unreachable_at_start_is_started_again_without_using_up_the_crash_retries(
        tmp_path: Path) -> None:
    agent, starts = unreachable(tmp_path, succeed_on=3, max_retries=0)
    outcome = agent.run()
    assert outcome.returncode == 0 and outcome.decision == "finished"
    assert [a.kind for a in outcome.attempts] == ["store-unreachable"] * 2 + ["ok"]
    assert len(starts.read_text().splitlines()) == 3


def test_the_wait_before_each_store_retry_doubles(tmp_path: Path) -> None:
    agent, _ = unreachable(tmp_path, succeed_on=3)
    agent.run()
    waits = [e["wait_seconds"] for e in events.read(agent.store, "r")
             if e["event"] == "policy" and e.get("action") == "restart"]
    assert waits == [0.01, 0.02]


def test_a_store_that_stays_unreachable_is_retried_only_up_to_its_bound(
        tmp_path: Path) -> None:
    agent, starts = unreachable(tmp_path, succeed_on=100, store_retries=2)
    outcome = agent.run()
    assert outcome.returncode == Exit.STORE_UNREACHABLE and outcome.decision == "stop"
    assert len(starts.read_text().splitlines()) == 3  # the first start and 2 retries
    assert "nothing was trained or lost" in outcome.message


def test_an_upload_that_failed_after_training_is_uploaded_by_the_agent_not_retrained(
        tmp_path: Path, moto_s3, monkeypatch: pytest.MonkeyPatch, no_freeze: None) -> None:
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    url = moto_s3.url()
    outcome = trained_not_uploaded(tmp_path, url).run()
    assert outcome.returncode == 0 and outcome.decision == "finished", outcome.message
    assert len(outcome.attempts) == 1  # training ran once
    remote = open_store(url, **moto_s3.options())
    assert reader.list_steps(remote, "up") == [3]
    reader.verify(remote, "up", 3)


def test_an_upload_that_still_fails_exits_93_with_the_push_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_freeze: None) -> None:
    monkeypatch.setattr(retry.RetryPolicy, "delay", lambda self, attempt, rng=None: 0.0)
    monkeypatch.setenv("BURST_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing there
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    outcome = trained_not_uploaded(tmp_path, "s3://burst/runs").run()
    assert outcome.returncode == Exit.UPLOAD_FAILED and outcome.decision == "upload-failed"
    assert len(outcome.attempts) == 1
    assert "burst push up --store s3://burst/runs --local " in outcome.message
    assert reader.list_steps(LocalStore(tmp_path / "tier"), "up") == [3]  # still kept


def test_burst_run_bounds_store_retries_by_its_option_and_exits_92(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    done = subprocess.run([sys.executable, "-m", "burst.cli", "run", "--run-id", "r",
                           "--store", str(tmp_path / "store"), "--store-retries", "1",
                           "--store-wait", "0", "--", sys.executable, "-c", UNREACHABLE_UNTIL,
                           str(starts), "100"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == Exit.STORE_UNREACHABLE, done.stderr
    assert len(starts.read_text().splitlines()) == 2 and "Traceback" not in done.stderr
    assert "start it again once the store answers" in done.stderr


def test_under_torchrun_rank_0_s_upload_failure_is_uploaded_not_read_as_an_error(
        tmp_path: Path, moto_s3, monkeypatch: pytest.MonkeyPatch, no_freeze: None) -> None:
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    url, tier = moto_s3.url(), tmp_path / "tier"
    agent = Agent([sys.executable, "-c", TORCHRUN_UPLOAD_FAILED, str(tier), url],
                  run_id="up", store=LocalStore(tier), store_url=url,
                  env={ENV_LOCAL: str(tier)}, say=lambda _m: None)
    outcome = agent.run()
    assert outcome.returncode == 0 and outcome.decision == "finished", outcome.message
    [attempt] = outcome.attempts
    assert (attempt.returncode, attempt.kind, attempt.rank) == (1, "upload-failed", 0)
    assert reader.list_steps(open_store(url, **moto_s3.options()), "up") == [3]

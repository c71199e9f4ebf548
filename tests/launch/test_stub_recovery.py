"""The local stub recovers a job the way SkyPilot 0.14.1's managed-job controller does.

Read from ``sky/jobs/recovery_strategy.py`` (``StrategyExecutor.should_restart_on_failure``,
``EagerFailoverStrategyExecutor.recover``) and ``sky/jobs/controller.py``: an exit code in
``recover_on_exit_codes`` is recovered without counting; any other failure (of the run or
of the setup) counts, and is recovered while the count is at most
``max_restarts_on_errors``; a preemption is always recovered; ``EAGER_NEXT_REGION``
relaunches from the top of the ordered list. A cluster (``sky.launch``) recovers nothing.

Each task is a few lines of bash on unsealed stub nodes (what is tested is the stub's
decisions, not the node); the node counts its own starts in a file of the test.
"""

from __future__ import annotations

import json
from pathlib import Path

from burst.launch import Reporter
from burst.launch.local import Faults, LocalLauncher
from burst.launch.task import RECOVER_ON, SKYPILOT_MAX_RESTARTS, parse

TASK = """\
name: stub-recovery
num_nodes: {nodes}
resources:
{recovery}
  ordered:
    - accelerators: "L4:1"
      infra: "aws/us-east-1"
      use_spot: true
    - accelerators: "A100:1"
      infra: "gcp/us-central1"
      use_spot: false
envs:
  STARTS: {starts}
setup: |
  {setup}
run: |
  echo "$SKYPILOT_NODE_RANK $SKYPILOT_CLUSTER_INFO" >> "$STARTS"
  n=$(wc -l < "$STARTS")
  {run}
"""


def recovery(codes: list[int], max_restarts: int) -> str:
    return ("  job_recovery:\n    strategy: EAGER_NEXT_REGION\n"
            f"    max_restarts_on_errors: {max_restarts}\n"
            f"    recover_on_exit_codes: {json.dumps(codes)}")


def task(tmp_path: Path, run: str, *, codes: list[int] | None = None, max_restarts: int = 0,
         setup: str = "true", nodes: int = 1, managed: bool = True):
    block = recovery(codes or [], max_restarts) if managed else ""
    return parse(TASK.format(nodes=nodes, recovery=block, starts=tmp_path / "starts",
                             setup=setup, run=run))


def launch(tmp_path: Path, rendered, **launcher) -> tuple[int, list[str], list[str]]:
    """Run the job; its exit code, the node starts (rank, region) and the stub's lines."""
    lines: list[str] = []
    stub = LocalLauncher(tmp_path / "nodes", seal="off", **launcher)
    result = stub.launch(rendered, {}, Reporter(say=lines.append, output=lambda _t: None))
    starts_file = tmp_path / "starts"
    starts = starts_file.read_text().splitlines() if starts_file.exists() else []
    regions = [f"{line.split()[0]} {json.loads(line.split(' ', 1)[1])['region']}"
               for line in starts]
    return result.returncode, regions, lines


def test_a_code_in_recover_on_exit_codes_is_recovered_without_counting(tmp_path):
    # max_restarts_on_errors 0, yet 87 is recovered every time it comes
    code, starts, _ = launch(tmp_path, task(tmp_path, '[ "$n" -ge 4 ] || exit 87',
                                            codes=[87]))
    assert code == 0 and len(starts) == 4


def test_other_failures_count_against_max_restarts_on_errors(tmp_path):
    code, starts, lines = launch(tmp_path, task(tmp_path, "exit 3", codes=[87], max_restarts=2))
    assert code == 3 and len(starts) == 3  # the first run and two restarts
    assert any("will not be retried" in line for line in lines)


def test_burst_rendering_ends_an_oom_job_at_its_first_node(tmp_path):
    code, starts, _ = launch(tmp_path, task(tmp_path, "exit 86", codes=list(RECOVER_ON),
                                            max_restarts=SKYPILOT_MAX_RESTARTS))
    assert code == 86 and len(starts) == 1


def test_a_failed_setup_counts_like_a_failed_run(tmp_path):
    marker = tmp_path / "setups"
    setup = f'echo x >> {marker}; [ "$(wc -l < {marker})" -ge 3 ] || exit 5'
    code, starts, _ = launch(tmp_path, task(tmp_path, "exit 0", setup=setup, max_restarts=1))
    assert code == 5 and starts == []  # two setups failed; the run never started
    assert len(marker.read_text().splitlines()) == 2


def test_any_nodes_recoverable_code_recovers_the_whole_job(tmp_path):
    run = '[ "$SKYPILOT_NODE_RANK" = 1 ] && [ "$n" -le 2 ] && exit 87; exit 0'
    code, starts, _ = launch(tmp_path, task(tmp_path, run, codes=[87], nodes=2))
    assert code == 0 and len(starts) == 4  # two nodes, twice


NOTICE = '[ -n "${BURST_FAULT:-}" ] && exit 88; exit 0'  # the node stops on the notice


def test_a_clean_88_racing_the_controllers_recheck_is_recovered_as_burst_renders_it(tmp_path):
    code, starts, lines = launch(tmp_path, task(tmp_path, NOTICE, codes=list(RECOVER_ON),
                                                max_restarts=SKYPILOT_MAX_RESTARTS),
                                 faults=Faults(preempt_at=1))
    assert code == 0 and len(starts) == 2
    assert any("still up at the controller's 5-second recheck" in line for line in lines)


def test_a_clean_88_without_it_in_recover_on_exit_codes_ends_the_job_failed(tmp_path):
    # SkyPilot's controller: the job FAILED, 5 s later the cluster is still UP, so the
    # exit code decides, and 88 alone is not recovered
    code, starts, _ = launch(tmp_path, task(tmp_path, NOTICE, codes=[87], max_restarts=0),
                             faults=Faults(preempt_at=1))
    assert code == 88 and len(starts) == 1


def test_a_machine_taken_away_is_recovered_without_counting(tmp_path):
    run = '[ -n "${BURST_FAULT:-}" ] && exit 137; exit 0'  # killed with its machine
    code, starts, lines = launch(tmp_path, task(tmp_path, run, max_restarts=0),
                                 faults=Faults(preempt_at=1, preempt="kill"))
    assert code == 0 and len(starts) == 2
    assert any("preempted (exit 137)" in line for line in lines)


def test_each_attempt_gets_its_own_fault(tmp_path):
    run = 'echo "${BURST_FAULT:-none}" >> "$STARTS.faults"; [ -n "${BURST_FAULT:-}" ] && exit 88; exit 0'
    faults = Faults(attempts=("term@3", "term@4"))
    code, starts, _ = launch(tmp_path, task(tmp_path, run, codes=list(RECOVER_ON)),
                             faults=faults)
    assert code == 0 and len(starts) == 3
    assert (tmp_path / "starts.faults").read_text().split() == ["term@3", "term@4", "none"]


def test_recovery_walks_the_ordered_list_from_the_top(tmp_path):
    # no capacity for the first candidate at first: the job starts on the second one, and
    # its recovery (EAGER_NEXT_REGION) tries the first one again
    code, starts, _ = launch(tmp_path, task(tmp_path, '[ "$n" -ge 2 ] || exit 87', codes=[87]),
                             faults=Faults(fail_first=1))
    assert code == 0 and starts == ["0 gcp/us-central1", "0 aws/us-east-1"]


def test_a_cluster_recovers_nothing_and_is_torn_down(tmp_path):
    code, starts, lines = launch(tmp_path, task(tmp_path, "exit 87", managed=False),
                                 mode="cluster")
    assert code == 87 and len(starts) == 1
    assert any("tearing down" in line for line in lines)
    assert list((tmp_path / "nodes").iterdir()) == []


def test_keep_keeps_the_cluster_node(tmp_path):
    code, _, lines = launch(tmp_path, task(tmp_path, "exit 0", managed=False), mode="cluster",
                            keep=True)
    assert code == 0 and any("kept" in line for line in lines)
    assert len([p for p in (tmp_path / "nodes").iterdir() if (p / "node0" / "home").is_dir()]) == 1

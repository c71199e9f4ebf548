"""What the rendered task asks SkyPilot to recover, checked with ``sky.Task.from_yaml_str``.

Only a sticky GPU failure (87) and the clean stop after a preemption notice (88) are in
``recover_on_exit_codes``: such codes bypass
``max_restarts_on_errors`` and ``EAGER_NEXT_REGION`` starts the ordered list from the top,
so an OOM there would be relaunched on the same card forever. ``max_restarts_on_errors`` is
0 and burst's own bound travels in the envs. A cluster has no recovery: no spot in it.
"""

from __future__ import annotations

import pytest

from burst.contract import Exit
from burst.errors import ConfigError
from burst.launch.task import NodeSoftware, TaskSpec, render, spot_policy
from burst.plan.cards import builtin
from burst.plan.planner import Plan, Target
from burst.plan.regions import place
from tests.helpers.sky_helpers import sky_view


def candidate(card: str, infra: str | None, spot: bool) -> Plan:
    target = Target(builtin().get(card), 1, 1, place(infra), spot)
    return Plan(target, 16, 8, 2, "bf16", False, True, None, 1, True, (8, 4))


def spec(plans: list[Plan], managed: bool = True, max_restarts: int = 4) -> TaskSpec:
    return TaskSpec("run-1", 7, "oom", "burst-run-1", plans, ["python", "train.py"],
                    {"BURST_RUN_ID": "run-1", "BURST_STORE": "s3://b/p"}, (),
                    NodeSoftware(None, "burst-failover==0.1"), managed, max_restarts)


SPOT_THEN_ON_DEMAND = [candidate("A100", "aws/us-east-1", True),
                       candidate("A100", "aws/us-east-1", False)]


def test_a_managed_job_recovers_gpu_failures_and_preemption_stops_only_and_carries_bounds():
    task = sky_view(render(spec(SPOT_THEN_ON_DEMAND)).yaml)
    for resources in task["resources"]:
        assert resources["job_recovery"] == {"strategy": "EAGER_NEXT_REGION",
                                             "max_restarts_on_errors": 0,
                                             "recover_on_exit_codes": [Exit.GPU_FAILURE,
                                                                       Exit.STOPPED]}
        assert Exit.OOM not in resources["job_recovery"]["recover_on_exit_codes"]
    assert task["envs"]["BURST_MAX_RESTARTS"] == "4"
    assert task["envs"]["BURST_MAX_PREEMPTIONS"] == "50"  # preemptions bounded apart


def test_cluster_mode_refuses_to_render_a_spot_candidate():
    with pytest.raises(ConfigError, match="cluster mode has no recovery"):
        render(spec(SPOT_THEN_ON_DEMAND, managed=False))


def test_cluster_mode_renders_on_demand_without_recovery_or_bound():
    task = sky_view(render(spec(SPOT_THEN_ON_DEMAND[1:], managed=False)).yaml)
    assert all(not r["use_spot"] and r["job_recovery"] is None for r in task["resources"])
    assert "BURST_MAX_RESTARTS" not in task["envs"]


@pytest.mark.parametrize(("asked", "managed", "policy", "said"), [
    ("first", True, "first", False),
    ("only", True, "only", False),
    ("first", False, "never", True),
    ("never", False, "never", False),
])
def test_spot_policy_falls_back_to_on_demand_for_a_cluster(asked, managed, policy, said):
    got, why = spot_policy(asked, managed)
    assert got == policy and (why is not None) == said


def test_spot_only_in_cluster_mode_is_refused():
    with pytest.raises(ConfigError, match="--spot needs recovery"):
        spot_policy("only", managed=False)

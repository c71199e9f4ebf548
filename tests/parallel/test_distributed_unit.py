"""Scale-out pieces that need no second process: launcher variables, the torchrun command,
per-rank RNG states, the optimizer layout conversion, world-size checks."""

from __future__ import annotations

import json
import random
import shlex

import numpy as np
import pytest
import torch

import burst
from burst.errors import ConfigError
from burst.parallel import sharded as dcp
from burst.parallel.group import Group
from burst.parallel.launching import (
    launch_from_env,
    one_box_env,
    torchrun_command,
    torchrun_shell,
)
from burst.state import rank_rng, rng
from burst.training.run import Step
from tests.conftest import assert_same

SKY_2x4 = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_GPUS_PER_NODE": "4"}


def test_torchrun_variables_win():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5",
           "MASTER_PORT": "29500", **SKY_2x4}
    launch = launch_from_env(env)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.source) == (3, 8, 1,
                                                                                  "torchrun")


def test_skypilot_variables_start_one_process_per_single_gpu_node():
    env = {**SKY_2x4, "SKYPILOT_NUM_GPUS_PER_NODE": "1", "BURST_MASTER_PORT": "31000"}
    launch = launch_from_env(env)
    assert (launch.rank, launch.world_size, launch.master_addr, launch.master_port) == (
        1, 2, "10.0.0.5", 31000)


def test_a_multi_gpu_node_without_torchrun_is_refused():
    with pytest.raises(ConfigError, match="torchrun"):
        launch_from_env(SKY_2x4)


def test_no_launcher_means_one_process():
    assert launch_from_env({}) is None


def test_torchrun_command_for_a_multi_node_cluster():
    cmd = torchrun_command(["train.py", "--lr", "1e-3"], env=SKY_2x4, python="python")
    assert cmd == ["python", "-m", "torch.distributed.run", "--nproc-per-node=4", "--nnodes=2",
                   "--node-rank=1", "--master-addr=10.0.0.5", "--master-port=29500",
                   "train.py", "--lr", "1e-3"]


def test_torchrun_command_for_one_node_is_standalone():
    env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_IPS": "10.0.0.5",
           "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    assert torchrun_command(["train.py"], env=env, python="python") == [
        "python", "-m", "torch.distributed.run", "--nproc-per-node=8", "--standalone", "train.py"]


def torchrun_shell_args(tmp_path, env: dict[str, str]) -> list[str]:
    """What the torchrun line of a task hands to ``python`` under ``env`` (a stand-in
    ``python`` prints its arguments)."""
    line = torchrun_shell("train.py --epochs 3", port=29600)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"$@\"\n")
    fake.chmod(0o755)
    import subprocess

    command = line.replace("python -m", f"{shlex.quote(str(fake))} -m", 1)
    return subprocess.run(["bash", "-c", command], env={**env, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True).stdout.split()


def test_torchrun_shell_reads_skypilots_variables_when_the_task_runs(tmp_path):
    assert torchrun_shell_args(tmp_path, SKY_2x4) == [
        "-m", "torch.distributed.run", "--nproc-per-node=4", "--nnodes=2", "--node-rank=1",
        "--master-addr=10.0.0.5", "--master-port=29600", "train.py", "--epochs", "3"]


def test_torchrun_shell_on_one_node_is_standalone(tmp_path):
    env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1",
           "SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NUM_GPUS_PER_NODE": "2"}
    assert torchrun_shell_args(tmp_path, env) == [
        "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", "train.py",
        "--epochs", "3"]


def test_one_box_env_gives_the_torchrun_line_its_processes(tmp_path):
    assert torchrun_shell_args(tmp_path, one_box_env(3)) == [
        "-m", "torch.distributed.run", "--nproc-per-node=3", "--standalone", "train.py",
        "--epochs", "3"]
    with pytest.raises(ConfigError, match="at least one process"):
        one_box_env(0)


def test_a_world_size_without_a_process_group_is_refused(monkeypatch):
    monkeypatch.delenv("BURST_WORLD_SIZE", raising=False)
    assert Group.for_run(None) == Group(0, 1) == Group.for_run(1)
    with pytest.raises(ConfigError, match="init_from_env"):
        Group.for_run(2)
    with pytest.raises(ConfigError, match="world_size is 2"):
        burst.Run("r", global_batch=8, world_size=2, store="/nonexistent-never-created")


def test_step_weight_counts_all_ranks_samples():
    """DDP averages the ranks' gradients, so a rank's share is weighted up by the world size."""
    assert Step(1, 0, 8, 1, iter([]), world_size=2).weight(4) == 1.0
    assert Step(1, 0, 8, 2, iter([]), world_size=1).weight(4) == 0.5


def test_rank_rng_states_survive_json_and_restore_exactly():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    torch.rand(3)
    state = json.loads(json.dumps(rank_rng.to_json(rng.capture())))
    expected = (torch.rand(4), random.random(), np.random.rand())
    rng.restore(rank_rng.from_json(state))
    assert_same((torch.rand(4), random.random(), np.random.rand()), expected)


def test_a_rank_the_snapshot_lacks_gets_fresh_deterministic_streams():
    saved = {"rng": "rank0", "rng_ranks": ["rank0", "rank1"]}
    assert rank_rng.for_rank(saved, 1, seed=0, step=6) == ("rank1", None)
    assert rank_rng.for_rank({"rng": "only"}, 0, seed=0, step=6) == ("only", None)
    _, seed = rank_rng.for_rank(saved, 2, seed=0, step=6)
    assert seed == rank_rng.rank_seed(0, 6, 2)
    draws = []
    for rank in (2, 2, 3):
        rng.restore(rank_rng.for_rank(saved, rank, seed=0, step=6)[0])
        draws.append((torch.rand(2).tolist(), random.random(), float(np.random.rand())))
    assert draws[0] == draws[1] != draws[2]  # same rank: same streams; another: different
    torch.manual_seed(seed)
    assert torch.rand(2).tolist() == draws[0][0]  # documented: torch.manual_seed(rank_seed)


def test_optimizer_state_by_name_and_back_is_the_plain_layout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW([{"params": model[0].parameters()},
                                   {"params": model[1].parameters(), "lr": 0.1}])
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    plain = optimizer.state_dict()
    named = dcp.by_name(plain, model, optimizer)
    assert list(named["state"]) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert named["param_groups"][1]["params"] == ["1.weight", "1.bias"]
    assert_same(dcp.by_index(named), plain)


def test_wrapper_prefixes_are_not_part_of_a_name():
    assert dcp.clean_name("module._orig_mod.layers.0._fsdp_wrapped_module.weight") == \
        "layers.0.weight"

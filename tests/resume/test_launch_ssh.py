"""The ``ssh`` launcher against a real OpenSSH server on 127.0.0.1: a detached job whose
log survives a dropped connection, secrets that never touch the box's disk, and host-key
checking that refuses an unknown host unless told otherwise."""

from __future__ import annotations

import threading
import time

import pytest

from burst.errors import BurstError
from burst.launch import Reporter
from burst.launch.ssh import SSHLauncher, Target, box_env, processes_on_box, task_gpu_counts
from burst.launch.task import parse

SECRET = "canary-ssh-secret-not-on-disk"
TASK = """
name: burst-ssh-test
resources:
  ordered:
    - {accelerators: "L4:1", infra: ssh/box, use_spot: false}
envs:
  GREETING: "hello there"
secrets:
  MY_TOKEN: null
setup: |
  echo "setup $GREETING"
run: |
  test "$MY_TOKEN" = "SECRET_VALUE" || exit 1
  for i in $(seq 1 25); do echo "line $i"; sleep 0.1; done
  exit 3
""".replace("SECRET_VALUE", SECRET)


def launcher(sshd, tmp_path, known_hosts=None, accept=False) -> SSHLauncher:
    target = Target.parse(f"ssh://127.0.0.1:{sshd.port}", None, str(sshd.client_key),
                          str(known_hosts or sshd.known_hosts))
    return SSHLauncher(target, str(tmp_path / "remote"), accept, "python3")


def test_job_survives_a_dropped_connection_and_output_is_complete(sshd, tmp_path):
    ssh = launcher(sshd, tmp_path)
    chunks: list[str] = []
    said: list[str] = []
    task = parse(TASK.replace(f'"{SECRET}"', '"$MY_TOKEN"'))

    def drop_once() -> None:
        while not any("line 5" in c for c in chunks):
            time.sleep(0.05)
        ssh.drop()

    threading.Thread(target=drop_once, daemon=True).start()
    result = ssh.launch(task, {"MY_TOKEN": SECRET}, Reporter(say=said.append,
                                                             output=chunks.append))
    assert result.returncode == 3
    text = "".join(chunks)
    assert text.startswith("setup hello there\n")
    assert [line for line in text.splitlines() if line.startswith("line")] == [
        f"line {i}" for i in range(1, 26)]
    assert any("connection" in s and "lost" in s for s in said)
    assert any("reconnected" in s for s in said)
    remote = tmp_path / "remote"
    for path in remote.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_secret_reaches_the_job(sshd, tmp_path):
    task = parse(TASK)
    result = launcher(sshd, tmp_path).launch(task, {"MY_TOKEN": SECRET},
                                             Reporter(say=lambda _m: None,
                                                      output=lambda _t: None))
    assert result.returncode == 3  # `test` passed: the loop ran to its `exit 3`
    wrong = launcher(sshd, tmp_path).launch(task, {"MY_TOKEN": "other"},
                                            Reporter(say=lambda _m: None,
                                                     output=lambda _t: None))
    assert wrong.returncode == 1


def test_unknown_host_is_refused_unless_accepted(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    task = parse(TASK)
    with pytest.raises(BurstError, match="not in known_hosts"):
        launcher(sshd, tmp_path, empty).launch(task, {"MY_TOKEN": SECRET}, Reporter())
    wrong = tmp_path / "wrong_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIDvP0s7eQyq3b2bFJk3Yl6kq2Jm3Vq1lJ1o0ZbXvXr9Y\n")
    with pytest.raises(BurstError, match="does NOT match"):
        launcher(sshd, tmp_path, wrong).launch(task, {"MY_TOKEN": SECRET}, Reporter())
    accepted = launcher(sshd, tmp_path, empty, accept=True).launch(
        task, {"MY_TOKEN": SECRET}, Reporter(say=lambda _m: None, output=lambda _t: None))
    assert accepted.returncode == 3


def test_bad_targets_are_config_errors():
    for url in ("ssh://", "ssh://host/path", "ssh://u:pw@host", "ssh://host:99999"):
        with pytest.raises(BurstError):
            Target.parse(url)


WORLD_TASK = """
name: burst-ssh-world
resources:
  ordered:
    - {accelerators: "L4:2", infra: ssh/box, use_spot: false}
envs:
  GREETING: "hi"
setup: |
  true
run: |
  echo "world $SKYPILOT_NUM_GPUS_PER_NODE $SKYPILOT_NODE_RANK $SKYPILOT_NUM_NODES $SKYPILOT_NODE_IPS ${CUDA_VISIBLE_DEVICES-unset}"
"""


def test_a_cpu_box_gets_skypilots_variables_for_the_ranks_the_task_asks_for(sshd, tmp_path):
    """No nvidia-smi on this box: 0 GPUs, so the task's 2 per node run as 2 CPU ranks."""
    chunks: list[str] = []
    said: list[str] = []
    result = launcher(sshd, tmp_path).launch(parse(WORLD_TASK), {},
                                             Reporter(say=said.append, output=chunks.append))
    assert result.returncode == 0
    assert "world 2 0 1 127.0.0.1 unset" in "".join(chunks)
    assert any("no GPU(s); running 2 process(es)" in s for s in said)


def test_the_first_gpu_count_the_box_has_is_used_and_the_rest_hidden():
    assert box_env([1], 8) == {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1",
                               "SKYPILOT_NODE_IPS": "127.0.0.1",
                               "SKYPILOT_NUM_GPUS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": "0"}
    assert box_env([4, 2], 2)["SKYPILOT_NUM_GPUS_PER_NODE"] == "2"  # 4 does not fit
    assert box_env([4, 2], 2).get("CUDA_VISIBLE_DEVICES") is None  # every GPU used
    assert box_env([8], 3)["SKYPILOT_NUM_GPUS_PER_NODE"] == "3"  # none fits: all it has
    assert box_env([2, 4], 0)["SKYPILOT_NUM_GPUS_PER_NODE"] == "2"  # CPU: the first count
    assert processes_on_box([], 0) == 1


def test_the_gpu_counts_come_from_the_tasks_candidates():
    assert task_gpu_counts(parse(WORLD_TASK)) == [2]
    assert task_gpu_counts(parse(TASK)) == [1]


def test_a_multi_node_task_is_refused_on_one_box(sshd, tmp_path):
    task = parse(WORLD_TASK.replace("resources:", "num_nodes: 2\nresources:"))
    with pytest.raises(BurstError, match="one box"):
        launcher(sshd, tmp_path).launch(task, {}, Reporter())

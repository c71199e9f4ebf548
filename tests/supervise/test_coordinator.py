"""The machine-local coordinator: claims, priorities, pauses and dead holders, against a
real SQLite registry in a temporary directory and real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from burst.errors import ConfigError
from burst.supervise.coordinator import PRIORITIES, Coordinator, parse_size
from burst.training import quota

GIB = 2**30
LOW, NORMAL, HIGH = PRIORITIES["low"], PRIORITIES["normal"], PRIORITIES["high"]


@pytest.fixture
def machine(tmp_path) -> Coordinator:
    """A machine whose card is modelled as 10 GiB."""
    return Coordinator(tmp_path / "coordinator", capacity=10 * GIB)


def test_a_higher_priority_run_asks_the_lower_one_to_pause_and_starts_once_it_has(machine):
    machine.register("low", 6 * GIB, LOW)
    assert machine.acquire("low")
    machine.register("high", 6 * GIB, HIGH)
    assert not machine.acquire("high")
    assert machine.pause_requested("low")
    machine.paused("low")
    assert machine.acquire("high")
    assert not machine.acquire("low")  # paused until the memory is free again


def test_a_run_of_the_same_priority_waits_without_pausing_anyone(machine):
    machine.register("first", 6 * GIB, NORMAL)
    assert machine.acquire("first")
    machine.register("second", 6 * GIB, NORMAL)
    assert not machine.acquire("second")
    assert not machine.pause_requested("first")


def test_freed_memory_goes_to_the_highest_priority_waiting_run(machine):
    machine.register("high", 6 * GIB, HIGH)
    assert machine.acquire("high")
    machine.register("low", 6 * GIB, LOW)
    machine.register("normal", 6 * GIB, NORMAL)
    assert not machine.acquire("low") and not machine.acquire("normal")
    machine.release("high")  # this process holds every claim here
    assert not machine.acquire("low")  # normal is ahead of it
    assert machine.acquire("normal")


def test_the_claim_of_a_killed_process_is_dropped(machine):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        machine.register("killed", 6 * GIB, NORMAL, pid=holder.pid)
        assert machine.acquire("killed")
    finally:
        holder.kill()  # SIGKILL: it never releases its claim
        holder.wait()
    machine.register("next", 6 * GIB, NORMAL)
    assert machine.acquire("next")  # it would wait forever behind a live claim
    assert [c.run_id for c in machine.claims()] == ["next"]


def test_a_run_id_holds_one_claim_per_machine(machine):
    machine.register("twice", 1 * GIB, NORMAL)
    with pytest.raises(ConfigError, match="already holds a claim"):
        machine.register("twice", 1 * GIB, NORMAL)


def test_an_agent_releases_only_its_own_claim(machine):
    machine.register("shared-id", 1 * GIB, NORMAL)
    machine.release("shared-id", pid=1)  # another process refused under the same run id
    assert [c.run_id for c in machine.claims()] == ["shared-id"]


def test_sizes_take_binary_and_decimal_units():
    assert parse_size("40GiB") == 40 * GIB and parse_size("6G") == 6 * 10**9
    with pytest.raises(ConfigError, match="not a memory size"):
        parse_size("lots")


def test_without_cuda_the_quota_is_recorded_and_not_applied():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the cap is applied (the GPU check covers it)")
    assert quota.apply(str(6 * GIB)) == {"quota": 6 * GIB, "applied": False}

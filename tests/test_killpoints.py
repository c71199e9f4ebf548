"""Kill points by name: ``NAME#K+J`` kills at the Jth point the same thread reaches after
NAME's Kth hit, whatever other threads reach meanwhile."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import threading
from burst import killpoints
killpoints.hit("blob"); killpoints.hit("blob")
other = threading.Thread(target=killpoints.hit, args=("event",)); other.start(); other.join()
killpoints.hit("written")
killpoints.hit("renamed")
"""


def run_child(spec: str, log) -> tuple[int, list[str]]:
    env = {"BURST_KILLPOINT": spec, "BURST_KILLPOINT_LOG": str(log), "PATH": ""}
    code = subprocess.run([sys.executable, "-c", CHILD], env=env, check=False).returncode
    return code, [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def test_another_threads_point_does_not_count_towards_a_named_kill(tmp_path):
    code, reached = run_child("blob#2+1", tmp_path / "points.log")
    assert code == -9
    assert reached == ["blob", "blob", "event", "written"]


def test_a_named_kill_without_an_offset_kills_at_the_hit_itself(tmp_path):
    code, reached = run_child("blob#1", tmp_path / "points.log")
    assert (code, reached) == (-9, ["blob"])


def test_a_named_point_never_reached_that_often_kills_nothing(tmp_path):
    code, reached = run_child("blob#3", tmp_path / "points.log")
    assert (code, reached) == (0, ["blob", "blob", "event", "written", "renamed"])

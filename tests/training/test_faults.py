"""Fault specs for drills: ``KIND@STEP[:MICRO][/RANK]``, where ``/RANK`` limits a fault to
one rank of a torchrun job (``$RANK``), so a drill can fail one rank and not the others."""

from __future__ import annotations

import pytest

from burst.contract import ENV_FAULT
from burst.errors import ConfigError
from burst.training import faults


def test_a_rank_suffix_limits_the_fault_to_that_rank():
    assert faults.parse("oom@8/1") == [faults.Fault("oom", 8, 0, 1)]
    assert faults.parse("sticky@3:1/0,kill@5") == [faults.Fault("sticky", 3, 1, 0),
                                                   faults.Fault("kill", 5)]


def test_each_rank_keeps_only_the_faults_meant_for_it(monkeypatch):
    monkeypatch.setenv(ENV_FAULT, "oom@8/1,term@9")
    monkeypatch.setenv("RANK", "1")
    assert [f.kind for f in faults.Injector.from_env().pending] == ["oom", "term"]
    monkeypatch.setenv("RANK", "0")
    assert [f.kind for f in faults.Injector.from_env().pending] == ["term"]
    monkeypatch.delenv("RANK")  # one plain process is rank 0
    assert [f.kind for f in faults.Injector.from_env().pending] == ["term"]


@pytest.mark.parametrize("spec", ["oom@8/", "oom@8/x", "oom@/1", "oom@8:2/-1"])
def test_a_bad_rank_is_a_clear_error(spec):
    with pytest.raises(ConfigError, match="KIND@STEP"):
        faults.parse(spec)

"""The environment rows: the run's lockfile is in the store, and every wheel its
wheelhouse index names is there at its size (real wheels, uploaded the way freeze does)."""

from __future__ import annotations

import pytest

from burst.preflight.environment import ENVIRONMENT, WHEELHOUSE, environment_rows
from burst.preflight.table import FAIL, OK
from burst.store import open_store
from tests.preflight.builders import frozen_run


@pytest.fixture
def frozen(tmp_path):
    """A store holding run ``r``'s lockfile and its two-wheel wheelhouse."""
    store = open_store(str(tmp_path / "store"))
    return store, frozen_run(store, "r", tmp_path)


def test_a_complete_wheelhouse_passes(frozen):
    store, _ = frozen
    rows = {row.name: row for row in environment_rows(store, "r")}
    assert rows[WHEELHOUSE].status == OK and "2 wheels" in rows[WHEELHOUSE].detail
    assert rows[ENVIRONMENT].passed


def test_a_wheel_missing_from_the_store_fails_the_row_naming_it(frozen):
    store, wheels = frozen
    store.delete(wheels[1].key)
    row = {row.name: row for row in environment_rows(store, "r")}[WHEELHOUSE]
    assert row.status == FAIL and wheels[1].file in row.detail
    assert wheels[0].file not in row.detail and "burst push r" in row.fix


def test_a_run_without_a_lockfile_fails_both_rows(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put("r/events.jsonl", b"")
    assert [row.status for row in environment_rows(store, "r")] == [FAIL, FAIL]

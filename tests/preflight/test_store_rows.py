"""The store rows of ``burst check`` on a real S3 server (SeaweedFS): write, read,
conditional write and delete all pass with a key that may write, and nothing is left.
(A read-only key: tests/cli/test_check_store.py.)"""

from __future__ import annotations

from burst.preflight.store import CONDITIONAL, DELETE, PREFIX, READ, WRITE, store_rows
from burst.preflight.table import OK
from burst.store import open_store
from tests.preflight.servers import store_env


def test_a_writable_store_passes_all_four_rows_and_keeps_nothing(seaweed, monkeypatch,
                                                                 tmp_path):
    store_env(monkeypatch, seaweed, tmp_path)
    store = open_store(seaweed.url())
    rows = store_rows(store)
    assert [(r.name, r.status) for r in rows] == [(WRITE, OK), (READ, OK), (CONDITIONAL, OK),
                                                 (DELETE, OK)]
    assert store.list(f"{PREFIX}/") == []

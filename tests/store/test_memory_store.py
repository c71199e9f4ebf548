"""The in-process store the unit tests use."""

from __future__ import annotations

from burst.store import MemoryStore, memory


def test_reset_empties_every_bucket_for_stores_opened_after_it():
    MemoryStore("kept").put("run/a", b"x")
    memory.reset()
    assert MemoryStore("kept").list("") == []

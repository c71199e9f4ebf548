"""Fixtures shared by the environment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from burst.env import lockfile


@pytest.fixture(scope="session")
def frozen() -> lockfile.Lockfile:
    """The lockfile of the environment running the tests (frozen once per session)."""
    return lockfile.build(Path.cwd())

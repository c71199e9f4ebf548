"""Errors a user can act on.

Every error burst raises on purpose derives from :class:`BurstError`; its message is one
line that says what went wrong and, where possible, what to do. The CLI prints exactly
that line and exits non-zero, so no traceback reaches a user for expected failures.
"""


class BurstError(Exception):
    """An expected failure with a one-line, user-facing message."""

    exit_code = 1


class ConfigError(BurstError):
    """Bad input from the user: a flag, a URL, a setting."""

    exit_code = 2


class SnapshotError(BurstError):
    """A snapshot is missing, incomplete, corrupt or does not fit what it is restored into."""


class StoreError(BurstError):
    """A store could not be reached or refused an operation."""


class LinkOutOfStoreError(StoreError):
    """A symbolic link inside a local store leads out of it: that part of the store is
    damaged (or planted), so a reader treats what lies behind it as missing and falls
    back to an older snapshot, as for a corrupt blob."""

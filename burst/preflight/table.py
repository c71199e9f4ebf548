"""The preflight's answer: one row per thing a burst needs, each passed, failed or unknown.

A row that could not be asked (no network, a tool missing, a check that timed out) is
``unknown``, never a pass: the point of the preflight is to learn before the crash, and a
guess of "fine" is exactly what it must not give. Whether a row counts for the verdict is
the row's own ``required`` flag, decided where the row is made (``burst.preflight.check``
says which and why); ``ready`` is True only when every required row passed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, FAIL, WARN, UNKNOWN, SKIP = "ok", "fail", "warn", "unknown", "skip"
STATUSES = (OK, FAIL, WARN, UNKNOWN, SKIP)
MARKS = {OK: "✓", FAIL: "✗", WARN: "!", UNKNOWN: "?", SKIP: "-"}


@dataclass(frozen=True)
class Row:
    """One check: what was checked, how it went, what it found, and how to fix it.

    ``warn`` is a pass with a caveat (a risk burst cannot measure); ``skip`` means the
    check does not apply (no run named, a file:// store has no credentials)."""

    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = True

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown preflight status {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status in (OK, WARN, SKIP)

    @property
    def blocks(self) -> bool:
        """True when this row keeps the burst from being ready."""
        return self.required and not self.passed

    @property
    def mark(self) -> str:
        return MARKS[self.status]

    def line(self) -> str:
        """The row as one plain line (logs, ``--json``-less scripts, events)."""
        need = "" if self.required else " (optional)"
        fix = f" -> fix: {self.fix}" if self.fix and self.status not in (OK, SKIP) else ""
        return f"{self.mark} {self.name}{need}: {self.status}: {self.detail}{fix}"


@dataclass
class Report:
    """Every row of one preflight, in the order they were checked."""

    rows: list[Row] = field(default_factory=list)

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    @property
    def ready(self) -> bool:
        return not any(row.blocks for row in self.rows)

    @property
    def blocking(self) -> list[Row]:
        return [row for row in self.rows if row.blocks]

    def row(self, name: str) -> Row:
        """The row called ``name`` (tests and scripts look rows up by name)."""
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"ready": self.ready, "rows": [asdict(row) for row in self.rows]}

    def event_fields(self) -> dict[str, Any]:
        """What a ``preflight`` event records: the verdict and each row that is not a pass
        (a passing row is the expected case and would only make the history longer)."""
        return {"ready": self.ready, "rows": len(self.rows),
                "problems": [{"name": r.name, "status": r.status, "detail": r.detail,
                              "required": r.required} for r in self.rows if not r.passed]}

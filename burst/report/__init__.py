"""``burst report``: an HTML page with PNG charts of one run's history.

Loss and throughput over time (from ``run.log``), GPU memory with the alert threshold
(from the agent's NVML samples), every snapshot, failure and resume, and the places the
run went. Built from the run's events and manifests only, so it works after the fact,
on another machine, for a run that is still going.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burst.contract import MembershipChange
from burst.report import charts, page
from burst.report.timeline import Timeline, load
from burst.store.base import Store

__all__ = ["Report", "Timeline", "load", "write_report"]


@dataclass
class Report:
    html: Path
    charts: dict[str, Path]
    summary: dict[str, Any]

    membership: list[MembershipChange] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"html": str(self.html), "charts": {k: str(v) for k, v in self.charts.items()},
                "summary": self.summary,
                "membership": [change.to_event() for change in self.membership]}


def write_report(store: Store, run_id: str, out_dir: str | Path, *more: Store,
                 threshold: float = 0.8) -> Report:
    """Write ``index.html`` and its charts into ``out_dir`` (created if needed)."""
    timeline = load(store, run_id, *more, threshold=threshold)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = charts.render_all(timeline, out)
    summary = summarize(timeline)
    html = out / "index.html"
    html.write_text(page.render(timeline, drawn, summary), encoding="utf-8")
    return Report(html, drawn, summary, timeline.membership)


def summarize(timeline: Timeline) -> dict[str, Any]:
    losses = [v for _, _, v in timeline.loss]
    rates = [v for _, v in timeline.throughput]
    return {
        "run": timeline.run_id,
        "started": timeline.started,
        "final step": timeline.final_step,
        "snapshots": len(timeline.snapshots),
        "failures": timeline.count("failure"),
        "resumes": timeline.count("resume"),
        "memory alerts": timeline.count("memory-alert"),
        "membership changes": len(timeline.membership),
        "steps lost": sum(c.steps_lost or 0 for c in timeline.membership),
        "seconds to train again": round(sum(c.seconds_to_step or 0.0
                                            for c in timeline.membership), 3),
        "last loss": round(losses[-1], 6) if losses else None,
        "median samples/s": round(sorted(rates)[len(rates) // 2], 1) if rates else None,
    }

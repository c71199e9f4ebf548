"""The report's HTML page: one self-contained file beside its PNG charts.

Plain HTML with inline CSS and no scripts, so it opens from a laptop's disk, an object
store's browser or a CI artifact alike; every value from the run is escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from burst.report.tables import MEMBERSHIP_COLUMNS, membership_rows
from burst.report.timeline import Timeline

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:960px;color:#212121}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;font-size:13px}th{background:#f5f5f5}.failure{color:#c62828}
.resume{color:#2e7d32}img{display:block;margin:.3em 0 1.2em}"""


def render(timeline: Timeline, charts: dict[str, Path], summary: dict[str, Any]) -> str:
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>burst report: {escape(timeline.run_id)}</title><style>{CSS}</style>"
             f"</head><body><h1>burst report: {escape(timeline.run_id)}</h1>",
             _table(["what", "value"], [[k, v] for k, v in summary.items()]),
             "<h2>Loss</h2>", _img(charts["loss"], "loss over time"),
             "<h2>Throughput</h2>", _img(charts["throughput"], "samples per second over time"),
             "<h2>GPU memory</h2>", _img(charts["memory"], "GPU memory with alert threshold"),
             "<h2>Where the run went</h2>", _places(timeline),
             "<h2>Snapshots</h2>", _snapshots(timeline),
             "<h2>Membership changes</h2>", _membership(timeline),
             "<h2>History</h2>", _history(timeline), "</body></html>"]
    return "\n".join(parts)


def _img(path: Path, alt: str) -> str:
    return f"<img src='{escape(path.name)}' alt='{escape(alt)}' width='900' height='300'>"


def _places(timeline: Timeline) -> str:
    if not timeline.places:
        return "<p>no start recorded</p>"
    keys = sorted({k for place in timeline.places for k in place} - {"t", "how"})
    rows = [[_clock(p["t"]), p["how"], *(p.get(k, "") for k in keys)] for p in timeline.places]
    return _table(["at", "how", *keys], rows)


def _snapshots(timeline: Timeline) -> str:
    if not timeline.snapshots:
        return "<p>no complete snapshot in the store</p>"
    keys = ["step", "reason", "time", "card", "micro", "accumulation"]
    return _table(keys, [[s.get(k, "") for k in keys] for s in timeline.snapshots])


def _membership(timeline: Timeline) -> str:
    if not timeline.membership:
        return "<p>none: the run never restarted</p>"
    return _table(list(MEMBERSHIP_COLUMNS), membership_rows(timeline.membership))


def _history(timeline: Timeline) -> str:
    rows = [[_clock(m.t), m.kind, m.label] for m in timeline.markers]
    return _table(["at", "event", "what"], rows, classes=[m.kind for m in timeline.markers])


def _table(head: list[str], rows: list[list[Any]], classes: list[str] | None = None) -> str:
    out = ["<table><tr>", *(f"<th>{escape(str(h))}</th>" for h in head), "</tr>"]
    for i, row in enumerate(rows):
        css = f" class='{escape(classes[i])}'" if classes else ""
        out.append(f"<tr{css}>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"+{minutes}:{secs:02d}"

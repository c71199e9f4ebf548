"""The report's PNG charts (matplotlib ``Figure`` objects drawn by Agg, never pyplot: no
display, no global backend state, safe on a headless box and from any thread).

Every chart has the same size and the same time axis (minutes since the run began) with
the run's snapshots, failures and resumes drawn across it, so the pictures line up when
read top to bottom. A chart without data still renders, saying why it is empty.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from burst.report.timeline import Marker, Timeline

WIDTH, HEIGHT, DPI = 900, 300, 100  # pixels: every chart is exactly this size
STYLE = {"snapshot": ("#9e9e9e", ":"), "failure": ("#d32f2f", "-"),
         "resume": ("#2e7d32", "--"), "memory-alert": ("#ef6c00", "-.")}


def render_all(timeline: Timeline, out_dir: Path) -> dict[str, Path]:
    """Write loss.png, throughput.png and memory.png into ``out_dir``."""
    return {"loss": _loss(timeline, out_dir / "loss.png"),
            "throughput": _throughput(timeline, out_dir / "throughput.png"),
            "memory": _memory(timeline, out_dir / "memory.png")}


def _loss(timeline: Timeline, path: Path) -> Path:
    fig, ax = _figure("loss")
    if timeline.loss:
        xs, ys = _gapped([(t, v) for t, _, v in timeline.loss], timeline.markers)
        ax.plot(xs, ys, color="#1565c0", linewidth=1.2, label="loss")
    else:
        _empty(ax, "no metrics logged (call run.log(loss=...) in the loop)")
    return _finish(fig, ax, timeline, path)


def _throughput(timeline: Timeline, path: Path) -> Path:
    fig, ax = _figure("samples / s")
    if timeline.throughput:
        xs, ys = _gapped(timeline.throughput, timeline.markers)
        ax.plot(xs, ys, color="#6a1b9a", linewidth=1.2, label="throughput")
    else:
        _empty(ax, "no throughput (needs run.log(...) on at least two steps)")
    return _finish(fig, ax, timeline, path)


def _memory(timeline: Timeline, path: Path) -> Path:
    fig, ax = _figure("GPU memory (GiB)")
    if timeline.memory:
        for index, series in sorted(timeline.memory.items()):
            ax.plot([_min(t) for t, _, _ in series], [used for _, used, _ in series],
                    linewidth=1.2, label=f"GPU {index} used")
        total = max(total for series in timeline.memory.values() for _, _, total in series)
        ax.axhline(total * timeline.threshold, color="#ef6c00", linewidth=1,
                   label=f"alert threshold ({timeline.threshold:.0%})")
        ax.axhline(total, color="#424242", linewidth=0.8, label="card memory")
    else:
        _empty(ax, "no GPU samples (run under `burst run` on a machine with NVML)")
    return _finish(fig, ax, timeline, path)


def _figure(ylabel: str):
    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    ax = fig.subplots()
    ax.set_ylabel(ylabel)
    ax.set_xlabel("minutes since the run began")
    ax.grid(alpha=0.3)
    return fig, ax


def _finish(fig, ax, timeline: Timeline, path: Path) -> Path:
    _draw_markers(ax, timeline.markers)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper right", fontsize=7)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.95, bottom=0.17)
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": the size must stay exact
    return path


def _draw_markers(ax, markers: list[Marker]) -> None:
    labelled: set[str] = set()
    for marker in markers:
        if marker.kind not in STYLE:
            continue
        color, style = STYLE[marker.kind]
        label = None if marker.kind in labelled else marker.kind
        labelled.add(marker.kind)
        ax.axvline(_min(marker.t), color=color, linestyle=style, linewidth=0.9, label=label)


def _gapped(points: list[tuple[float, float]], markers: list[Marker]
            ) -> tuple[list[float], list[float]]:
    """x (minutes) and y with a gap wherever the process stopped and another took over,
    so the chart does not draw training across the outage."""
    breaks = [m.t for m in markers if m.kind in ("failure", "resume", "start")]
    xs: list[float] = []
    ys: list[float] = []
    for i, (t, v) in enumerate(points):
        if i and any(points[i - 1][0] < b <= t for b in breaks):
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(_min(t))
        ys.append(v)
    return xs, ys


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            color="#757575")


def _min(seconds: float) -> float:
    return seconds / 60

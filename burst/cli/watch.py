"""``burst status RUN --watch``: the run's pulse, redrawn every few seconds.

On a terminal it is a rich ``Live`` table, redrawn in place. Anywhere else (a CI log, a
pipe, ``| tee``) there is nothing to redraw, so each update is printed as plain lines, one
block per interval, with no control codes; ``--once`` prints one update and stops.
Ctrl-C ends the watch, and that is not an error: exit 0. The values come from
:func:`burst.resume.live.live_view`; this module only draws them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from burst.cli.console import cell, human_age, make_console, shown
from burst.errors import BurstError
from burst.snapshot.catalog import human_bytes

Fetch = Callable[[], dict[str, Any]]


def watch(fetch: Fetch, interval: float, once: bool = False, as_json: bool = False,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Show ``fetch()`` now, then every ``interval`` seconds until Ctrl-C (or once)."""
    console = make_console()
    try:
        view = fetch()  # a run that is not there is one error line, before any drawing
        if as_json or once or not console.is_terminal:
            _plain(view, as_json)
            while not once:
                sleep(interval)
                _plain(_refetch(fetch), as_json)
            return
        from rich.live import Live

        with Live(render(view), console=console, auto_refresh=False) as live:
            while True:
                sleep(interval)
                live.update(render(_refetch(fetch)), refresh=True)
    except KeyboardInterrupt:  # the way to stop watching: not a failure
        return


def _refetch(fetch: Fetch) -> dict[str, Any]:
    """The next update; a store that fails once (a dropped link) is shown, not fatal."""
    try:
        return fetch()
    except BurstError as error:
        return {"error": str(error)}


def _plain(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(view, default=str, sort_keys=True))
    else:
        click.echo("\n".join(shown(line) for line in lines(view)))
    sys.stdout.flush()  # click.echo wrote there (click 9 drops get_text_stream)


def fields(view: dict[str, Any]) -> list[tuple[str, str]]:
    """The view as (what, value) pairs, in the order people read them."""
    if "error" in view:
        return [("error", f"could not read the run: {view['error']}")]
    place = view["where"]
    rate = view.get("samples_per_second")
    failure = view.get("last_failure")
    return [
        ("where", f"{place.get('place')}: {place.get('state')}"
                  + (f" since {place['since']}" if place.get("since") else "")),
        ("step", _text(view.get("step"))),
        ("samples/s", "?" if rate is None else f"{rate:.1f}"),
        ("loss", "?" if view.get("loss") is None else f"{view['loss']:.6g}"),
        ("snapshot", _snapshot(view.get("snapshot"))),
        ("upload backlog", ", ".join(f"step {s}" for s in view.get("upload_backlog") or [])
         or "none"),
        ("memory", _memory(view.get("memory"))),
        ("last failure", f"{failure.get('kind')} at step {failure.get('step')}: "
                         f"{failure.get('reason')}" if failure else "none"),
    ]


def lines(view: dict[str, Any]) -> list[str]:
    """One plain update: a header, a line per field, a line per recent event."""
    out = [f"burst status {view.get('run', '')} at {view.get('time', '')}".rstrip()]
    out += [f"  {what}: {value}" for what, value in fields(view)]
    out += [f"  event {_event(e)}" for e in view.get("events") or []]
    return out


def render(view: dict[str, Any]) -> Any:
    """The view as rich renderables: the fields, then the recent events."""
    from rich.console import Group
    from rich.table import Table

    table = Table(title=cell(f"{view.get('run', '')} in {view.get('store', '')} "
                               f"({view.get('time', '')})"), show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for what, value in fields(view):
        table.add_row(what, cell(value))
    recent = Table(title="last events", show_header=False, show_edge=False)
    recent.add_column("event")
    for event in view.get("events") or []:
        recent.add_row(cell(_event(event)))
    return Group(table, recent)


def _snapshot(snap: dict[str, Any] | None) -> str:
    if not snap:
        return "none yet"
    age = snap.get("age_seconds")
    where = "in the store" if snap.get("in_store") else "local only"
    return f"step {snap.get('step')} ({snap.get('reason')}), {human_age(age)} ago, {where}"


def _memory(memory: dict[str, Any] | None) -> str:
    if not memory:
        return "not measured (a CPU run, or no GPU watch)"
    if memory.get("source") == "gpu-sample":
        return (f"{human_bytes(memory['used_bytes'])} of {human_bytes(memory['total_bytes'])} "
                f"on {memory['gpus']} GPU(s)")
    return f"peak {human_bytes(memory['peak_bytes'])} (newest snapshot, {memory.get('card')})"


def _event(event: dict[str, Any]) -> str:
    extra = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("time", "event"))
    return f"{event.get('time')} {event.get('event')}" + (f" {extra}" if extra else "")




def _text(value: Any) -> str:
    return "?" if value is None else str(value)

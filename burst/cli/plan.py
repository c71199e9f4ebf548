"""``burst plan [RUN]``: where the run could continue, and with what batch layout and precision."""

from __future__ import annotations

import json
import os

import click

from burst import config as user_config
from burst.cli.options import (
    gpu_counts,
    infra_list,
    json_option,
    local_option,
    split_csv,
    store_option,
)
from burst.contract import ENV_OFFLINE, ENV_RUN_ID, Reason
from burst.env import interpreter
from burst.errors import BurstError
from burst.plan import planner, regions
from burst.plan.cards import GIB
from burst.plan.replan import Replan, replan
from burst.resume import downloads
from burst.snapshot.catalog import human_bytes
from burst.store import Store, open_store


@click.command("plan")
@click.argument("run_id", required=False, envvar=ENV_RUN_ID)
@click.option("--gpu", "cards", multiple=True, metavar="NAME[,NAME]",
              help="Allowed cards (default: every card in the catalog).")
@click.option("--count", "counts", multiple=True, metavar="N[,N]",
              help="GPUs per node to consider (default 1).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--region", default="any", show_default=True,
              help="Region profile: any, beijing, us, europe, or [regions.NAME] in the config.")
@click.option("--infra", multiple=True, metavar="INFRA",
              help="SkyPilot infra strings to use instead of a profile (k8s/ctx, aws/us-east-1).")
@click.option("--margin", type=click.FloatRange(0, 1, min_open=True),
              default=planner.DEFAULT_MARGIN, show_default=True,
              help="Fraction of a card's memory the predicted peak may use.")
@click.option("--amp", type=click.Choice(planner.AMP_POLICIES), default="auto", show_default=True,
              help="auto: bf16 where supported, else fp16 with a GradScaler; keep: as recorded.")
@click.option("--spot", type=click.Choice(planner.SPOT_POLICIES), default="first",
              show_default=True)
@click.option("--order", default=None, metavar="TIER[,TIER]",
              help="Failover tiers in order: own (your k8s/ssh), spot, on-demand (default: "
                   "the profile's order, else own,spot,on-demand).")
@click.option("--steps", "total_steps", type=click.IntRange(min=1), default=None,
              help="The run's total optimizer steps (for the time to finish).")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="The run's total epochs (for the time to finish).")
@click.option("--after-oom", is_flag=True,
              help="Plan as if the run had run out of memory (only bigger cards).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="burst config file (default $BURST_CONFIG or ~/.config/burst/config.toml).")
@click.option("--offline", is_flag=True, envvar=ENV_OFFLINE,
              help=f"Use only the embedded card table, not SkyPilot's catalog (${ENV_OFFLINE}); "
                   "places are still checked against SkyPilot's cached catalog files, which "
                   "need no network.")
@click.option("--limit", type=click.IntRange(min=1), default=15, show_default=True,
              help="Rows to show (fitting candidates first).")
@store_option
@local_option
@json_option
def plan_command(run_id: str | None, cards: tuple[str, ...], counts: tuple[str, ...], nodes: int,
                 region: str, infra: tuple[str, ...], margin: float, amp: str, spot: str,
                 order: str | None, total_steps: int | None, epochs: int | None, after_oom: bool,
                 config_path: str | None, offline: bool, limit: int, store_url: str,
                 local_url: str, as_json: bool) -> None:
    """Rank where RUN_ID could continue: card, count, place, spot, micro-batch, accumulation,
    precision, predicted memory, price and time to finish. The chosen plan is first."""
    if not run_id:
        raise click.UsageError("give a RUN_ID (or set $BURST_RUN_ID)")
    store = open_store(store_url)
    result = replan(
        store, run_id, cards=split_csv(cards, "--gpu"), region=region, infra=infra_list(infra),
        counts=gpu_counts(counts), nodes=nodes,
        options=planner.Options(margin=margin, amp=amp, spot=spot,
                                order=regions.parse_order(order, "--order") if order else None),
        total_steps=total_steps, epochs=epochs, reason=Reason.OOM if after_oom else None,
        config=user_config.load(config_path), skypilot=not offline and not os.environ.get(
            ENV_OFFLINE),
    )
    python = interpreter.for_run(store, run_id, [p.target.place.image_id
                                                 for p in result.plans if p.fits] or [None])
    fetched = node_downloads(store, run_id, local_url, result)
    if as_json:
        click.echo(json.dumps({**_as_json(result), "node_python": None if python is None else
                               {"way": python.kind, "python": python.python,
                                "why": python.why}, "downloads": fetched.as_dict()}, indent=1))
    else:
        _print(result, limit)
        click.echo(f"node python: {interpreter.describe(python)}")
        _print_downloads(fetched)
    result.choose()  # nothing fits: the one-line reason, non-zero exit


def node_downloads(store: Store, run_id: str, local_url: str, result: Replan
                   ) -> downloads.Downloads:
    """What the node would fetch to resume now (:mod:`burst.resume.downloads`)."""
    try:
        local: Store | None = open_store(local_url)
    except BurstError:
        local = None
    return downloads.downloads(store, run_id, local=local,
                               candidates=[p for p in result.plans if p.fits])


def _print_downloads(fetched: downloads.Downloads) -> None:
    click.echo("the node downloads:")
    for item in fetched.items:
        size = "size unknown" if item.bytes is None else human_bytes(item.bytes)
        missing = f", {human_bytes(item.missing)} not in the store yet" if item.missing else ""
        note = f" ({item.note})" if item.note else ""
        click.echo(f"  {item.what}: {size} from the {item.source}{missing}{note}")
    for problem in fetched.problems:
        click.echo(f"  could not read {problem}")
    click.echo(f"  from the store: {human_bytes(fetched.from_store)}, "
               f"{_timed(fetched.downlink, fetched.from_store)}")
    if fetched.to_upload:
        click.echo(f"  uploaded from here first: {human_bytes(fetched.to_upload)}, "
                   f"{_timed(fetched.uplink, fetched.to_upload)}")


def _timed(speed: downloads.Speed, size: int) -> str:
    seconds = speed.seconds(size)
    if seconds is None:
        return "time unmeasured (no measured speed yet)"
    return (f"about {_duration(seconds) if seconds >= 60 else f'{seconds:.0f} s'} at "
            f"{(speed.rate or 0) * 8 / 1e6:.1f} Mbit/s ({speed.by})")


def _as_json(result: Replan) -> dict:
    chosen = result.chosen
    return {
        "run_id": result.facts.run_id, "step": result.facts.step,
        "global_batch": result.facts.global_batch, "card": result.facts.card,
        "reason": result.facts.reason, "steps_per_second": result.facts.steps_per_second,
        "steps_remaining": result.facts.steps_remaining, "catalog": result.catalog,
        "profile": result.profile.name, "profile_notes": list(result.profile.notes),
        "order": list(result.order), "places_from": list(result.places_from),
        "skipped": [{"infra": t.place.infra, "card": t.card.name, "spot": t.spot,
                     "tier": t.tier, "why": why} for t, why in result.skipped],
        "chosen": chosen.to_dict() if chosen else None,
        "candidates": [p.to_dict() for p in result.plans],
    }


def _print(result: Replan, limit: int) -> None:
    from rich.markup import escape  # rich loads for the table, not for --json
    from rich.table import Table

    from burst.cli.console import make_console

    console = make_console()
    run = result.facts
    table = Table(title=escape(f"plans for {run.run_id} at step {run.step} (global batch "
                               f"{run.global_batch}, was {run.card}, {run.amp or 'fp32'})"),
                  caption=escape(f"catalog: {result.catalog}; profile: {result.profile.name}; "
                                 f"tiers: {' > '.join(result.order)}; places of one row "
                                 "are tried in order"))
    for column in ("#", "tier", "card", "GPUs", "where", "spot", "fits", "micro", "accum", "AMP",
                   "peak / budget", "$/h", "to finish"):
        table.add_column(column, justify="right" if column in (
            "#", "GPUs", "micro", "accum", "$/h", "to finish") else "left")
    groups = _groups(result.plans)
    for index, (plan, places) in enumerate(groups[:limit], 1):
        table.add_row(*_row(index, plan, places),
                      style="bold" if index == 1 and plan.fits else None)
    console.print(table)
    if len(groups) > limit:
        console.print(f"[dim]{len(groups) - limit} more rows (--limit; --json lists every "
                      "candidate)[/dim]")
    for note in result.profile.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if result.skipped:
        first = result.skipped[0]
        console.print(f"[dim]{len(result.skipped)} card/place crossings skipped: they do not "
                      f"exist (e.g. {escape(first[1])}); places from "
                      f"{escape('; '.join(result.places_from))}[/dim]")
    chosen = result.chosen
    if chosen is not None:
        console.print(f"[bold]chosen:[/bold] {escape(_where(chosen))}")
        console.print("  env: " + escape(" ".join(f"{k}={v}" for k, v in
                                                  chosen.to_env().items())))
        for note in chosen.notes:
            console.print(f"  - {escape(note)}")
    problems = {p.target.card.name: p.problem for p, _ in groups[:limit] if not p.fits}
    for card, problem in problems.items():
        console.print(f"[red]{escape(card)}:[/red] {escape(problem or '')}")


def _groups(plans: list[planner.Plan]) -> list[tuple[planner.Plan, list[str]]]:
    """Consecutive candidates that differ only in place, as one row with their places."""
    groups: list[tuple[planner.Plan, list[str]]] = []
    for plan in plans:
        key = _group_key(plan)
        if groups and plan.fits and _group_key(groups[-1][0]) == key:
            groups[-1][1].append(plan.target.place.label)
        else:
            groups.append((plan, [plan.target.place.label]))
    return groups


def _group_key(plan: planner.Plan) -> tuple:
    target = plan.target
    return (target.card.name, target.count, target.nodes, target.spot, plan.fits,
            target.tier)


def _row(index: int, plan: planner.Plan, places: list[str]) -> list[str]:
    from rich.markup import escape

    target = plan.target
    gpus = f"{target.count}x{target.nodes}" if target.nodes > 1 else str(target.count)
    where = escape(places[0] + (f" +{len(places) - 1}" if len(places) > 1 else ""))
    if not plan.fits:
        return [str(index), "-", target.card.name, gpus, where, "-", "[red]no[/red]",
                "-", "-", "-", "-", _price(plan.price_per_hour), "-"]
    return [
        str(index), target.tier, target.card.name, gpus, where,
        "yes" if target.spot else "no", "probe" if plan.probe else "[green]yes[/green]",
        str(plan.micro_batch), str(plan.accumulation), plan.amp or "fp32",
        f"{_gib(plan.peak_bytes)} / {_gib(plan.budget_bytes)}", _price(plan.price_per_hour),
        _duration(plan.seconds_to_finish),
    ]


def _where(plan: planner.Plan) -> str:
    target = plan.target
    image = f", image {target.place.image_id}" if target.place.image_id else ""
    return (f"{target.count}x {target.card.name} x{target.nodes} node(s) at "
            f"{target.place.label} ({'spot' if target.spot else 'on-demand'}, "
            f"tier {target.tier}{image})")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _price(price: float | None) -> str:
    return "?" if price is None else f"{price:.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = round(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m"


COMMANDS = (plan_command,)

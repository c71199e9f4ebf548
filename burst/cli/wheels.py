"""The wheelhouse options ``burst freeze`` and ``burst push`` share: which wheels to store
for the node, and the one-line report of what was stored. Kept apart from ``cli.env`` so
``push`` loads no table drawing or environment checking."""

from __future__ import annotations

from typing import Any

import click

from burst.env import lockfile, wheelchoice, wheelhouse
from burst.snapshot.catalog import human_bytes
from burst.store import Store, is_local

WHEELS_HELP = ("Store the lockfile's wheels for the node: all (torch too: a node needs no "
               "index, but a CUDA torch and its libraries add 3-4 GB to the store, uploaded "
               "once per store), no-torch (torch comes from a mirror on the node: "
               "$BURST_TORCH_INDEX), none. Recorded for the run: burst resume builds the "
               "same unless told otherwise. Default: what was chosen before, else "
               "$BURST_WHEELS, else all for a remote store, none for a local one.")


def wheels_options(fn: Any) -> Any:
    """``--wheels``, ``--wheels-machine`` and ``--torch-variant``: which wheelhouse to store."""
    fn = click.option("--torch-variant", default=None,
                      help="torch build to store (cpu, cu128, ...; default: the recorded "
                           "CUDA build, else the one a Hopper card needs).")(fn)
    fn = click.option("--wheels-machine", type=click.Choice(list(wheelhouse.MACHINES)),
                      default=None, help="The node's CPU (default: x86_64).")(fn)
    return click.option("--wheels", "wheels", type=click.Choice(list(wheelhouse.POLICIES)),
                        default=None, help=WHEELS_HELP)(fn)


def wheel_target(store: Store, run_id: str, lock: lockfile.Lockfile, policy: str | None,
                 machine: str | None, torch_variant: str | None) -> wheelhouse.Target | None:
    """The wheelhouse to build for ``store``, or None for none; the choice is recorded
    for the run, so ``burst resume`` builds the same (:mod:`burst.env.wheelchoice`)."""
    return wheelchoice.choose(store, run_id, lock,
                              wheelchoice.Choice(policy, machine, torch_variant),
                              local=is_local(store))


def describe_wheels(uploaded: wheelhouse.Uploaded | None) -> str:
    if uploaded is None:
        return "wheelhouse   already stored (or off)"
    info = wheelhouse.summary(uploaded.index)
    line = (f"wheelhouse   {info['wheels']} wheels, {human_bytes(info['bytes'])}; "
            f"{uploaded.wheels_sent} uploaded ({human_bytes(uploaded.bytes_sent)}), "
            f"{uploaded.wheels_present} already stored")
    for m in info["missing"]:
        line += f"\n  missing {m['name']} {m['version']}: {m['why']}"
    return line

"""Which wheelhouse a resumed run's node installs from, and why.

In order, the first that says:

1. the resume's own command line (``burst resume --wheels ...``): the user overrides;
2. what was chosen at freeze or push, recorded for the run (:mod:`burst.env.wheelchoice`);
3. ``$BURST_WHEELS`` (and ``_MACHINE``, ``_TORCH``) where the resume runs;
4. the wheelhouse already in the store for this lockfile: it costs no upload;
5. a default by where the run goes. A node on a public cloud reaches
   ``download.pytorch.org`` (or ``$BURST_TORCH_INDEX``), so it gets ``no-torch``: the 3-4 GB
   of a CUDA torch are not uploaded at failure time, the node fetches them next to the
   cloud's own network. Anything else gets ``all``: own capacity (a Kubernetes cluster,
   an SSH pool or box) may reach no package index at all (mainland China: often neither
   PyPI nor the torch index), and the local stub's sealed node reaches none.

Fields merge in that order: ``--torch-variant cu128`` at resume keeps a recorded
``no-torch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from burst.contract import ENV_TORCH_INDEX
from burst.env import wheelchoice, wheelhouse
from burst.env.lockfile import Lockfile
from burst.plan import planner

ALL, NO_TORCH = "all", "no-torch"


@dataclass(frozen=True)
class Decision:
    """The wheelhouse the node gets, and the one-line reason."""

    target: wheelhouse.Target
    why: str


def decide(lock: Lockfile, *, flags: wheelchoice.Choice, recorded: wheelchoice.Choice,
           stored: Mapping[str, Any] | None, candidates: Sequence[planner.Plan],
           to: str, environ: Mapping[str, str] | None = None) -> Decision:
    """See the module's docstring; ``stored`` is the store's index for this lockfile."""
    environment = wheelchoice.from_environment(environ)
    choice = flags.over(recorded).over(environment)
    if choice.policy is not None:
        source = ("--wheels of this resume" if flags.policy else
                  "chosen at freeze/push" if recorded.policy else f"${wheelhouse.POLICY_ENV}")
        return Decision(wheelchoice.target(choice, lock, choice.policy),
                        f"{choice.policy}: {source}")
    if choice.empty and stored is not None and isinstance(stored.get("target"), dict):
        kept = _stored_target(lock, stored["target"])
        if kept is not None:
            return Decision(kept, f"{kept.policy}: the wheelhouse already in the store")
    policy, why = by_target(candidates, to)
    return Decision(wheelchoice.target(choice, lock, policy), f"{policy}: {why}")


def by_target(candidates: Sequence[planner.Plan], to: str) -> tuple[str, str]:
    """The default policy for where the run goes, and why."""
    if to == "local":
        return ALL, "the local stub's sealed node reaches no package index"
    if to != "skypilot":
        return ALL, "an SSH box may reach no package index (mainland China)"
    own = sorted({p.target.place.label for p in candidates if p.target.place.own_capacity})
    if own:
        return ALL, (f"own capacity ({', '.join(own)}) may reach no package index "
                     "(mainland China: often neither PyPI nor download.pytorch.org)")
    return NO_TORCH, (f"public-cloud candidates only: the node fetches torch from "
                      f"${ENV_TORCH_INDEX} or download.pytorch.org, not from the store")


def _stored_target(lock: Lockfile, data: Mapping[str, Any]) -> wheelhouse.Target | None:
    """The store's wheelhouse as a target, when it is one this lockfile can use."""
    policy, machine = data.get("policy"), data.get("machine")
    if policy not in wheelhouse.POLICIES or machine not in wheelhouse.MACHINES:
        return None
    made = wheelhouse.target_for(lock, machine=machine, policy=policy,
                                 torch_variant=data.get("torch_variant"))
    return made if made.to_json() == dict(data) else None

"""The wheelhouse the user chose for a run, kept in the store so later steps use it too.

``burst push --wheels no-torch`` (or ``--torch-variant``, ``--wheels-machine``, at freeze or
push, or through ``$BURST_WHEELS``...) is a decision about the node: torch and its CUDA
libraries (3-4 GB) come from a mirror, or a build for another card, or another CPU. A resume
that worked the policy out again would build and upload exactly what the user chose to
leave out, at failure time. So the choice is written where it is made, to
``<run>/env/wheel-choice.json``, and ``burst resume`` uses it unless its own command line
says otherwise (:mod:`burst.resume.wheelpolicy`). Only what the user chose is recorded: a
field left to the default stays open, for the default by target at resume.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from burst.env import wheelhouse
from burst.env.lockfile import Lockfile
from burst.errors import ConfigError
from burst.store.base import Store, check_key

FILE = "wheel-choice.json"


def key(run_id: str) -> str:
    return check_key(f"{run_id}/env/{FILE}")


@dataclass(frozen=True)
class Choice:
    """What the user set (None: left to the default)."""

    policy: str | None = None
    machine: str | None = None
    torch_variant: str | None = None

    def __post_init__(self) -> None:
        if self.policy is not None and self.policy not in wheelhouse.POLICIES:
            raise ConfigError(f"wheelhouse policy must be one of "
                              f"{', '.join(wheelhouse.POLICIES)}, got {self.policy!r}")
        if self.machine is not None and self.machine not in wheelhouse.MACHINES:
            raise ConfigError(f"wheelhouse machine must be one of "
                              f"{', '.join(wheelhouse.MACHINES)}, got {self.machine!r}")

    @property
    def empty(self) -> bool:
        return self == Choice()

    def over(self, other: Choice) -> Choice:
        """This choice, completed by ``other`` where this one is open."""
        return Choice(self.policy or other.policy, self.machine or other.machine,
                      self.torch_variant or other.torch_variant)

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)


def from_environment(environ: Mapping[str, str] | None = None) -> Choice:
    """What ``$BURST_WHEELS``, ``$BURST_WHEELS_MACHINE`` and ``$BURST_WHEELS_TORCH`` say."""
    environ = os.environ if environ is None else environ
    return Choice(*((environ.get(name) or "").strip() or None
                    for name in (wheelhouse.POLICY_ENV, wheelhouse.MACHINE_ENV,
                                 wheelhouse.TORCH_VARIANT_ENV)))


def recorded(store: Store, run_id: str) -> Choice:
    """The choice recorded for the run (an empty one when none was)."""
    try:
        data = json.loads(store.get(key(run_id)))
    except KeyError:
        return Choice()
    except ValueError:
        raise ConfigError(f"{key(run_id)} in {store.url} is not JSON: remove it, or choose "
                          "again with burst push --wheels ...") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key(run_id)} in {store.url} is not a JSON object")
    return Choice(data.get("policy"), data.get("machine"), data.get("torch_variant"))


def record(store: Store, run_id: str, choice: Choice) -> Choice:
    """Record ``choice`` over the one already recorded (what it leaves open stays as it
    was); nothing is written for an empty choice. Returns what is recorded now."""
    before = recorded(store, run_id)
    after = choice.over(before)
    if after != before:
        store.put(key(run_id), (json.dumps(after.to_json(), sort_keys=True) + "\n").encode())
    return after


def target(choice: Choice, lock: Lockfile, default_policy: str) -> wheelhouse.Target:
    """The wheelhouse ``choice`` asks for, ``default_policy`` where it names none."""
    return wheelhouse.target_for(lock, machine=choice.machine,
                                 policy=choice.policy or default_policy,
                                 torch_variant=choice.torch_variant)


def choose(store: Store, run_id: str, lock: Lockfile, flags: Choice, *, local: bool,
           environ: Mapping[str, str] | None = None) -> wheelhouse.Target | None:
    """At freeze or push: record what the user chose (``flags``, else what was recorded
    before, else the environment), and return the wheelhouse to build (None: none). Left open, the policy is ``all`` for a remote store and ``none`` for a local one
    (the local tier, which no node reads)."""
    before = recorded(store, run_id)
    choice = record(store, run_id, flags.over(before).over(from_environment(environ)))
    policy = choice.policy or ("none" if local else "all")
    return None if policy == "none" else target(choice, lock, policy)


def in_effect(store: Store, run_id: str,
              environ: Mapping[str, str] | None = None) -> Choice:
    """What a run's own freeze follows: the recorded choice, else the environment."""
    return recorded(store, run_id).over(from_environment(environ))

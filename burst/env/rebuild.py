"""Rebuilding a run's frozen environment on the machine it resumes on: the one procedure
behind ``burst env install`` and a node's ``burst node setup``.

Both fetch the run's wheelhouse from the store (a node in mainland China may reach no
index), plan the install for this machine's card, restore the code where asked, install,
install the project's editable packages from the code, and compare what is now there with
the lockfile. What differs is the caller's to decide, and only that: where the lockfile,
the torch target and the installer options come from (flags, or the task), where the
wheelhouse is downloaded, whether the code archive is restored here (a node restores it
first, together with the run's inputs), and how the differences are reported (a
command's table or JSON; a node's log and its refusal to train).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from burst.env import check as envcheck
from burst.env import codearchive, torchvariant, wheelhouse
from burst.env import install as envinstall
from burst.env.lockfile import Lockfile
from burst.store import Store

Say = Callable[[str], None]


@dataclass(frozen=True)
class Code:
    """The run's code on this machine: the directory its editable packages install from,
    and the archive to restore there first (None: the code is already in place)."""

    directory: Path
    archive: dict[str, Any] | None = None


@dataclass
class Rebuilt:
    """What a rebuild did, for the caller to report."""

    plan: envinstall.Plan
    restored: list[str] = field(default_factory=list)  # code files restored
    editable_failed: list[str] = field(default_factory=list)  # a warning each, not an error
    differences: list[envcheck.Difference] = field(default_factory=list)  # against the lock


def rebuild(lock: Lockfile, target: torchvariant.Target, options: envinstall.Options, *,
            store: Store | None = None, run_id: str = "", wheelhouse_to: Path | None = None,
            code: Code | None = None, say: Say = print) -> Rebuilt:
    """Install ``lock`` here for ``target`` and compare the result with it.

    ``wheelhouse_to``: download the run's wheelhouse from ``store`` there first and install
    from it (unless ``options`` names one already); None: no download. ``code``: restore
    its archive (if any) before installing, and install the editable packages from its
    directory after; None: no code here. Raises :class:`burst.errors.BurstError` when the
    install fails; differences from the lockfile are returned, not judged."""
    if wheelhouse_to is not None and store is not None and options.wheelhouse is None:
        options = replace(options, wheelhouse=fetch_wheelhouse(store, run_id, lock.digest,
                                                               wheelhouse_to, say))
    plan = envinstall.make_plan(lock, target, options)
    for note in plan.notes:
        say(note)
    done = Rebuilt(plan)
    if code is not None and code.archive is not None and store is not None:
        done.restored = codearchive.restore(store, run_id, code.archive, code.directory)
        say(f"restored {len(done.restored)} files of code {code.archive['archive'][:12]} "
            f"into {code.directory.resolve()}")
    envinstall.execute(plan, echo=say)
    if code is not None:
        done.editable_failed = envinstall.install_editable(plan, code.directory, echo=say)
    done.differences = envcheck.compare(lock, envcheck.live_in(plan.python))
    return done


def fetch_wheelhouse(store: Store, run_id: str, digest: str, dest: Path,
                     say: Say = print) -> Path | None:
    """The run's wheelhouse in ``dest``: each wheel already there is hash-checked and kept
    (a node's bootstrap fetched some, nothing is fetched twice), the rest come from the
    store; None when the store has none for this lockfile."""
    if wheelhouse.load_index(store, run_id, digest) is None:
        say(f"no wheelhouse for lockfile {digest[:12]} in the store: installing from an index")
        return None
    index = wheelhouse.download(store, run_id, digest, dest)
    say(f"wheelhouse: {len(index.get('wheels') or [])} wheels in {dest}")
    return dest

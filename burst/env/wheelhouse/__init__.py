"""The wheelhouse: every pinned distribution of a lockfile as a wheel, in the store.

A node in Beijing often reaches no package index at all, so it must get the run's whole
environment from the store, burst itself included. At freeze and push time (on the user's
machine, which can reach its index) every pin is turned into a wheel for the node's platform
(manylinux x86_64 or aarch64, the lock's CPython) and stored content-addressed at
``wheels/<sha256>/<file>``, shared by every run in the store, so a wheel is uploaded once
per store, ever. Each lockfile gets an index, ``<run>/env/wheelhouse-<lock digest>.json``,
that names its wheels (with their role) and what could not be had ("missing", with why):
the node installs from the wheelhouse first and asks a mirror only for the missing.

Wheels come from pip (``pip download --only-binary=:all: --platform ...``, through whatever
indexes pip is configured with here), or are built here: burst's own wheel and the run's
editable/local packages from their source (never from an index), sdist-only pins when
they build. torch follows the card's build (:mod:`burst.env.torchvariant`); the ``policy``
decides whether its multi-GB wheels go into the store at all. Downloads are kept in
``~/.cache/burst/wheels`` (``$BURST_WHEEL_CACHE``), so freezing again downloads nothing.

Where pip cannot fetch a pin (no index reachable: found out once, by one probe or the first
failed batch, never pin by pin; or the pin is not on it), the distribution installed in the
environment being frozen is repacked into a wheel when its ``WHEEL`` tags run on the node
(a macOS or Windows build does not: it is listed missing). The index marks those wheels
``"repacked": true``. A resumed run that freezes its node's environment again reuses an
index whose wheels cover its pins instead of building one.

The parts, one concept each: :mod:`.target` (the node: Python, machine, torch build,
policy), :mod:`.house` (the records), :mod:`.pins` (which wheels), :mod:`.cache` (the
wheel cache here), :mod:`.pip` and :mod:`.reach` (running pip, reaching an index),
:mod:`.fetch` (pip downloads), :mod:`.source` (builds), :mod:`.repack` (what is installed
here), :mod:`.assemble` (all of them in cost order), :mod:`.index` and :mod:`.transfer`
(the index, the store). This module is the public face the rest of burst imports.
"""

from __future__ import annotations

from burst.env.wheelhouse.assemble import build
from burst.env.wheelhouse.house import (
    BURST_DIST,
    FORMAT,
    ROLES,
    Say,
    Wheel,
    Wheelhouse,
    WheelhouseError,
    wheel_key,
)
from burst.env.wheelhouse.index import (
    INDEX_FILE,
    index_key,
    load_index,
    read_local,
    summary,
    wheels_in,
)
from burst.env.wheelhouse.pins import Pin, plan
from burst.env.wheelhouse.pip import PIP_TIMEOUT
from burst.env.wheelhouse.repack import installed_tags
from burst.env.wheelhouse.target import (
    MACHINE_ENV,
    MACHINES,
    NODE_GLIBC,
    POLICIES,
    POLICY_ENV,
    TORCH_VARIANT_ENV,
    Target,
    default_policy,
    target_for,
)
from burst.env.wheelhouse.transfer import Uploaded, download, ensure, upload
from burst.staging.wheelcache import CACHE_ENV, cache_dir

__all__ = [
    "BURST_DIST", "CACHE_ENV", "FORMAT", "INDEX_FILE", "MACHINES", "MACHINE_ENV", "NODE_GLIBC",
    "PIP_TIMEOUT", "POLICIES", "POLICY_ENV", "ROLES", "TORCH_VARIANT_ENV", "Pin", "Say",
    "Target", "Uploaded", "Wheel", "Wheelhouse", "WheelhouseError", "build", "cache_dir",
    "default_policy", "download", "ensure", "index_key", "installed_tags", "load_index",
    "plan", "read_local", "summary", "target_for", "upload", "wheel_key", "wheels_in",
]

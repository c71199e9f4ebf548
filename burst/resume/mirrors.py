"""Package mirrors forwarded to a resumed run's node, as a fallback to its wheelhouse.

The node installs from the run's wheelhouse in the store first; a mirror is only asked for
what the wheelhouse lacks (a node in mainland China often reaches no index at all, and a
mirror may be the one it does reach). The mirrors are the ones this machine's pip and uv
are configured with (:mod:`burst.env.pkgindex`), or ``$BURST_INDEX_URL``,
``$BURST_EXTRA_INDEX_URL``, ``$BURST_TORCH_INDEX`` when set. They travel under those names:
a URL without credentials as a task env; one with credentials as a secret of the same
name, so the YAML holds its name and SkyPilot hands the value to the node at launch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from burst.contract import ENV_EXTRA_INDEX_URL, ENV_INDEX_URL, ENV_TORCH_INDEX
from burst.env import pkgindex
from burst.redact import strip_url

_PRIMARY_SOURCES = ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
_EXTRA_SOURCES = ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL")


def forwarded(environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(envs, secrets)``: each mirror variable in one of them, by whether it holds a
    credential."""
    env = os.environ if environ is None else environ
    configured = pkgindex.configured_indexes(env)
    values = {
        ENV_INDEX_URL: env.get(ENV_INDEX_URL) or _first_raw(env, _PRIMARY_SOURCES)
        or pkgindex.primary_index(configured) or "",
        ENV_EXTRA_INDEX_URL: env.get(ENV_EXTRA_INDEX_URL) or " ".join(dict.fromkeys(
            [*_raw_all(env, _EXTRA_SOURCES),
             *(i.url for i in configured if i.role == "extra-index"
               and not i.origin.startswith("env "))])),
        ENV_TORCH_INDEX: env.get(ENV_TORCH_INDEX) or pkgindex.torch_index_template(configured) or "",
    }
    envs, secrets = {}, {}
    for name, value in values.items():
        urls = [u for u in value.split() if pkgindex.is_remote(u)]
        if name == ENV_EXTRA_INDEX_URL:
            urls = [u for u in urls if not _is_torch(u)]
        if not urls:
            continue
        joined = " ".join(urls)
        if any(strip_url(u) != u for u in urls):
            secrets[name] = joined
        else:
            envs[name] = joined
    return envs, secrets


def _first_raw(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[n].split()[0] for n in names if env.get(n, "").strip()), None)


def _raw_all(env: Mapping[str, str], names: tuple[str, ...]) -> list[str]:
    return [u for n in names for u in env.get(n, "").replace(",", " ").split()]


def _is_torch(url: str) -> bool:
    """A PyTorch build index: forwarded as the template, not as one fixed build."""
    return pkgindex.torch_index_template([pkgindex.Index(strip_url(url), "extra-index", "")]
                                         ) is not None

"""Options shared by several commands."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import click

from burst.contract import ENV_LOCAL, ENV_STORE
from burst.errors import StoreError
from burst.store import (
    Store,
    default_local_url,
    default_store_url,
    is_local,
    open_store,
)

store_option = click.option(
    "--store",
    "store_url",
    default=default_store_url,
    show_default=f"${ENV_STORE} or ./.burst",
    help="Where snapshots live: a path, file://, s3://, oss://, gs://, sftp://.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def open_existing(url: str, **settings: Any) -> Store:
    """The store at ``url`` for a command that only looks (ls, status, show, verify,
    report): a local folder that does not exist is an error, never an empty store (a
    mistyped path would otherwise say "no runs" and exit 0)."""
    store = open_store(url, **settings)
    root = getattr(store, "root", None)
    if is_local(store) and root is not None and not root.is_dir():
        raise StoreError(f"no store at {store.url}: the folder does not exist")
    return store


def store_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--endpoint-url``, ``--region`` and ``--profile``, handed to the command as
    ``settings`` for ``open_store``; they win over the environment and the config file."""

    @functools.wraps(fn)
    def wrapper(*args: Any, endpoint_url: str | None, region: str | None,
                profile: str | None, **kwargs: Any) -> Any:
        settings = {"endpoint_url": endpoint_url, "region": region, "profile": profile}
        return fn(*args, settings={k: v for k, v in settings.items() if v}, **kwargs)

    for option in (
        click.option("--profile", default=None, help="AWS profile for s3:// and oss://."),
        click.option("--region", default=None, help="Region (for oss://: oss-cn-beijing...)."),
        click.option("--endpoint-url", default=None,
                     help="S3-compatible endpoint (MinIO, Ceph, COS, OBS, SeaweedFS...)."),
    ):
        wrapper = option(wrapper)
    return wrapper


local_option = click.option(
    "--local",
    "local_url",
    default=default_local_url,
    show_default=f"${ENV_LOCAL} or ./.burst",
    help="The local snapshot directory (what the run writes before uploading).",
)


def split_csv(values: tuple[str, ...], flag: str = "") -> list[str]:
    """A repeatable option that also takes commas: ``--gpu A100,H100 --gpu L4``.

    A value with nothing in it (``--gpu ''``) is refused: dropped, it would mean the same
    as no flag at all (every card), the opposite of narrowing the choice."""
    parts = []
    for value in values:
        named = [part.strip() for part in value.split(",") if part.strip()]
        if not named:
            raise click.BadParameter(f"{value!r} names nothing", param_hint=flag or None)
        parts += named
    return parts


def gpu_counts(values: tuple[str, ...]) -> list[int]:
    """``--count 1,2,4`` as integers (one GPU when none is given)."""
    try:
        counts = [int(v) for v in split_csv(values, "--count")] or [1]
    except ValueError:
        raise click.BadParameter(f"GPU counts must be integers, got {', '.join(values)}",
                                 param_hint="--count") from None
    if min(counts) < 1:
        raise click.BadParameter(f"GPU counts must be 1 or more, got {', '.join(values)}",
                                 param_hint="--count")
    return counts


def check_parses(url: str, flag: str) -> str:
    """``url`` if a URL parser takes it (host, brackets, port); else a usage error that
    shows it without credentials, instead of the parser's bare ValueError."""
    from urllib.parse import urlsplit

    from burst.redact import strip_url

    try:
        urlsplit(url).port  # noqa: B018 - parsing the port is part of the check
    except ValueError as exc:
        raise click.BadParameter(f"{strip_url(url)!r} is malformed ({exc})",
                                 param_hint=flag or None) from None
    return url


def check_target(_ctx: click.Context | None, _param: click.Parameter | None,
                 to: str | None) -> str | None:
    """A click callback for ``--to``-like options: skypilot, local or an ssh:// URL that
    parses, checked when the command starts, not when a failure needs it."""
    if to is None or to in ("skypilot", "local"):
        return to
    if not to.startswith("ssh://"):
        raise click.BadParameter(f"{to!r}: use skypilot, local or ssh://[user@]host[:port]")
    return check_parses(to, "")


# SkyPilot's infra shapes (sky/utils/schemas.py, 0.14): CLOUD[/REGION[/ZONE]], */REGION,
# k8s|kubernetes[/CONTEXT]. Checked here so a typo is one plain line, not the schema's regex.
_INFRA = re.compile(r"^(?:(?:[A-Za-z][A-Za-z0-9-]*|\*)(?:/[^/\s]+){0,2}|"
                    r"(?i:kubernetes|k8s)(?:/\S+)?)$")
#: The clouds SkyPilot 0.14 knows (``sky.skylet.constants.ALL_CLOUDS``; a test keeps them
#: equal). Importing SkyPilot to ask would cost seconds on every ``--infra``.
SKYPILOT_CLOUDS = (
    "aws", "azure", "cudo", "do", "fluidstack", "gcp", "hyperbolic", "ibm", "kubernetes",
    "lambda", "mithril", "nebius", "oci", "paperspace", "primeintellect", "runpod", "scp",
    "seeweb", "shadeform", "slurm", "ssh", "vast", "verda", "vsphere", "yotta")


def infra_list(values: tuple[str, ...]) -> list[str]:
    """``--infra`` values, each checked against SkyPilot's shape and its clouds."""
    places = split_csv(values, "--infra")
    for place in places:
        cloud = place.split("/", 1)[0].lower()
        known = cloud in (*SKYPILOT_CLOUDS, "k8s", "*", "any")  # any: SkyPilot picks
        if not _INFRA.match(place) or not known:
            raise click.BadParameter(
                f"{place!r} is not a SkyPilot infra: use CLOUD[/REGION[/ZONE]] (aws/us-east-1), "
                "k8s/CONTEXT or ssh/POOL" + ("" if known else f"; clouds: "
                                              f"{', '.join(SKYPILOT_CLOUDS)}"),
                param_hint="--infra")
    return places

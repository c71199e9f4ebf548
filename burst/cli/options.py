"""Options shared by several commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from burst.store import DEFAULT_STORE_ENV, LOCAL_ENV, default_local_url, default_store_url

store_option = click.option(
    "--store",
    "store_url",
    default=default_store_url,
    show_default=f"${DEFAULT_STORE_ENV} or ./.burst",
    help="Where snapshots live: a path, file://, s3://, oss://, gs://, sftp://.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


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
    show_default=f"${LOCAL_ENV} or ./.burst",
    help="The local snapshot directory (what the run writes before uploading).",
)


def split_csv(values: tuple[str, ...]) -> list[str]:
    """A repeatable option that also takes commas: ``--gpu A100,H100 --gpu L4``."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def gpu_counts(values: tuple[str, ...]) -> list[int]:
    """``--count 1,2,4`` as integers (one GPU when none is given)."""
    try:
        return [int(v) for v in split_csv(values)] or [1]
    except ValueError:
        raise click.BadParameter(f"GPU counts must be integers, got {values!r}",
                                 param_hint="--count") from None

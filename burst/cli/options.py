"""Options shared by several commands."""

from __future__ import annotations

import click

from burst.store import DEFAULT_STORE_ENV, default_store_url

store_option = click.option(
    "--store",
    "store_url",
    default=default_store_url,
    show_default=f"${DEFAULT_STORE_ENV} or ./.burst",
    help="Where snapshots live: a path, file://, s3://, oss://, gs://, sftp://.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")

"""Store settings: command-line flags over environment over ``~/.config/burst/config.toml``.

The config file names stores and says how to reach them, never who you are::

    [stores.beijing]
    url = "oss://my-bucket/runs"
    region = "oss-cn-beijing"

    [stores.lab]
    url = "s3://ckpt/burst"
    endpoint_url = "https://minio.lab:9000"
    addressing_style = "path"

``--store beijing`` then means that URL with those settings, and a URL under a section's
``url`` picks up its settings too. Credentials stay where their SDKs already look (the AWS
environment and profiles, ``OSS_ACCESS_KEY_ID``, gcloud, ``~/.ssh``): a config file with a
secret in it is refused, so burst never becomes one more place a key leaks from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from burst import config as user_config
from burst.contract import ENV_ENDPOINT_URL
from burst.errors import ConfigError
from burst.redact import strip_url

#: Every setting a store accepts, with the environment variable that can supply it.
OPTIONS: dict[str, str] = {
    "endpoint_url": ENV_ENDPOINT_URL,
    "region": "BURST_REGION",
    "addressing_style": "BURST_ADDRESSING_STYLE",
    "profile": "BURST_PROFILE",
    "ca_bundle": "BURST_CA_BUNDLE",
    "part_size": "BURST_PART_SIZE",
    "workers": "BURST_WORKERS",
    "payload_signing": "BURST_PAYLOAD_SIGNING",
    "internal": "BURST_OSS_INTERNAL",  # true, false, or auto: the internal endpoint first
    "internal_endpoint": "BURST_OSS_INTERNAL_ENDPOINT",  # what auto tries first
    "ssh_config": "BURST_SSH_CONFIG",
    "known_hosts": "BURST_KNOWN_HOSTS",
    "identity_file": "BURST_SSH_IDENTITY",
    "project": "BURST_GCS_PROJECT",
    "bucket_endpoint": "BURST_BUCKET_ENDPOINT",
    "node_identity": "BURST_NODE_IDENTITY",
}
_SECRETS = ("secret", "password", "token", "access_key", "private_key", "credential")


def config_path() -> Path:
    """The one burst config file (``burst.config`` finds and parses it for every reader)."""
    return user_config.default_path()


def load_sections(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The ``[stores.NAME]`` sections of the config file (none if there is no file)."""
    path = path or config_path()
    sections = user_config.section(user_config.load(path) if path.exists() else {}, "stores")
    if not all(isinstance(v, dict) for v in sections.values()):
        raise ConfigError(f"{path}: [stores.NAME] sections must be tables")
    for name, section in sections.items():
        _check_section(path, name, section)
    return sections


def _check_section(path: Path, name: str, section: dict[str, Any]) -> None:
    for key in section:
        if any(word in key.lower() for word in _SECRETS):
            raise ConfigError(f"{path}: [stores.{name}] holds {key!r}; keep credentials where "
                              "their SDK reads them (environment, profiles, ~/.ssh), not here")
        if key != "url" and key not in OPTIONS:
            raise ConfigError(f"{path}: [stores.{name}] has unknown setting {key!r} "
                              f"(known: url, {', '.join(sorted(OPTIONS))})")


def resolve(url: str, flags: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The URL ``url`` stands for and its settings: flags, then environment, then file."""
    sections = load_sections()
    options: dict[str, Any] = {}
    if url in sections and "://" not in url:
        section = sections[url]
        if "url" not in section:
            raise ConfigError(f"{config_path()}: [stores.{url}] needs a url")
        url = section["url"]
        options.update(section)
    else:
        options.update(_section_for(url, sections))
    options.pop("url", None)
    for name, env in OPTIONS.items():
        if os.environ.get(env):
            options[name] = os.environ[env]
    options.update({k: v for k, v in (flags or {}).items() if v is not None})
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ConfigError(f"unknown store setting(s): {', '.join(sorted(unknown))}")
    check_url(url)
    if options.get("endpoint_url"):
        check_endpoint(str(options["endpoint_url"]))
    return url, options


def check_url(url: str) -> None:
    """Refuse a store URL no backend could mean: empty (it would silently be the current
    directory), one a URL parser rejects (``sftp://[::1``, a port of 99999), or a local
    path that is a file (listing it would report "no runs", as if it were an empty store)."""
    if not url.strip():
        raise ConfigError("the store is empty: give a path, file://, s3://, oss://, gs:// "
                          "or sftp:// URL, or a [stores.NAME] from the config file")
    local = url
    if "://" in url:
        parts = _split(url, "store URL")
        local = parts.path if parts.scheme.lower() == "file" else ""
    if local and Path(local).expanduser().exists() and not Path(local).expanduser().is_dir():
        raise ConfigError(f"the store {url!r} is a file, not a directory")


def check_endpoint(endpoint: str) -> None:
    """An endpoint is ``http(s)://host[:port][/path]`` and nothing more: botocore raises a
    bare ValueError for anything else, and credentials in it would end up in logs (they
    belong where the SDK reads them)."""
    parts = _split(endpoint, "endpoint_url")
    shown = strip_url(endpoint)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"endpoint_url {shown!r} is not an http:// or https:// URL with a "
                          "host (like https://minio.lab:9000)")
    if "@" in parts.netloc:
        raise ConfigError(f"endpoint_url {shown!r} holds credentials: put them where the SDK "
                          "reads them (AWS_ACCESS_KEY_ID..., a profile), not in the URL")
    if parts.query or parts.fragment:
        raise ConfigError(f"endpoint_url {shown!r} has a query or fragment: give only "
                          "scheme, host, port and path")


def _split(url: str, what: str) -> SplitResult:
    """``url`` parsed, its port checked; a ConfigError that shows it without secrets."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check (1..65535)
    except ValueError as exc:
        raise ConfigError(f"{what} {strip_url(url)!r} is malformed ({exc})") from None
    return parts


def _section_for(url: str, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Settings of the section whose ``url`` is the longest prefix of ``url``."""
    best: dict[str, Any] = {}
    best_len = -1
    for section in sections.values():
        base = str(section.get("url", "")).rstrip("/")
        if base and (url == base or url.startswith(base + "/")) and len(base) > best_len:
            best, best_len = section, len(base)
    return dict(best)


def as_int(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"store setting {name} must be an integer, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"store setting {name} must be positive, got {number}")
    return number


def as_bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"store setting {name} must be true or false, got {value!r}")

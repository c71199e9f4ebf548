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
from pathlib import Path
from typing import Any

from burst import config as user_config
from burst.errors import ConfigError

#: Every setting a store accepts, with the environment variable that can supply it.
OPTIONS: dict[str, str] = {
    "endpoint_url": "BURST_ENDPOINT_URL",
    "region": "BURST_REGION",
    "addressing_style": "BURST_ADDRESSING_STYLE",
    "profile": "BURST_PROFILE",
    "ca_bundle": "BURST_CA_BUNDLE",
    "part_size": "BURST_PART_SIZE",
    "workers": "BURST_WORKERS",
    "payload_signing": "BURST_PAYLOAD_SIGNING",
    "internal": "BURST_OSS_INTERNAL",
    "ssh_config": "BURST_SSH_CONFIG",
    "known_hosts": "BURST_KNOWN_HOSTS",
    "identity_file": "BURST_SSH_IDENTITY",
    "project": "BURST_GCS_PROJECT",
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
    return url, options


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


def as_bool(options: dict[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"store setting {name} must be true or false, got {value!r}")

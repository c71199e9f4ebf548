"""The user's burst configuration: one TOML file, read only when a command asks for it.

Settings that describe the user's world rather than one run (extra GPU cards, region
profiles with their own Kubernetes contexts and SSH pools) live in
``$BURST_CONFIG`` or, failing that, ``$XDG_CONFIG_HOME/burst/config.toml``
(``~/.config/burst/config.toml``). A missing file is an empty configuration; a file that
does not parse is a one-line error naming the file, never a silently ignored setting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from burst.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib  # novermin
else:  # Python 3.10 (a node's Ubuntu 22.04)
    import tomli as tomllib

CONFIG_ENV = "BURST_CONFIG"


def default_path() -> Path:
    """Where the configuration lives when no path is given."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "burst" / "config.toml"


def load(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The parsed configuration; a file named by ``path`` must exist, the default may not
    (as for the store settings, which read the same file)."""
    target = Path(path).expanduser() if path is not None else default_path()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path is not None:
            raise ConfigError(f"config file {target} does not exist") from None
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {target}: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {target} is not valid TOML: {exc}") from None


def section(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A top-level table of the configuration (empty if absent); anything else is an error."""
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"config: [{name}] must be a table of tables")
    return value

"""Where packages come from: the package indexes pip and uv are configured to use.

A node in Beijing usually installs through a mirror (``pypi.tuna.tsinghua.edu.cn``,
``mirrors.aliyun.com``), and a CUDA build of torch comes from a PyTorch index
(``download.pytorch.org/whl/cu128`` or a mirror of it). Neither is visible in package
metadata, so burst reads the same configuration the installers read: pip's config files
and ``PIP_*`` variables, uv's ``uv.toml`` / ``[tool.uv]`` and ``UV_*`` variables. Every
URL is stripped of credentials (:func:`burst.redact.strip_url`) before it is returned;
only the *names* of the variables a URL came from are kept.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from burst.redact import strip_url

if sys.version_info >= (3, 11):
    import tomllib  # novermin
else:  # Python 3.10 (a node's Ubuntu 22.04)
    import tomli as tomllib

PYPI = "https://pypi.org/simple"
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
_TORCH_VARIANT_SEGMENT = re.compile(r"/(cpu|cu\d{2,3}|rocm\d+(?:\.\d+)*|xpu)/?$")


@dataclass(frozen=True)
class Index:
    """One configured source of packages. ``role``: index, extra-index or find-links."""

    url: str
    role: str
    origin: str  # e.g. "pip config /etc/pip.conf" or "env PIP_INDEX_URL": never a value

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def configured_indexes(environ: Mapping[str, str] | None = None,
                       project_dir: Path | None = None) -> list[Index]:
    """Every index pip and uv would use here, highest precedence first, deduplicated."""
    env = os.environ if environ is None else environ
    pip_files = [list(_pip_file(path)) for path in reversed(_pip_config_paths(env))]
    found = [*_pip_env(env), *(i for group in pip_files for i in group), *_uv_env(env),
             *_uv_files(env, project_dir)]
    seen: set[tuple[str, str]] = set()
    out = []
    for index in found:
        if (index.url, index.role) not in seen:
            seen.add((index.url, index.role))
            out.append(index)
    return out


def primary_index(indexes: list[Index]) -> str | None:
    """The index that replaces PyPI (the first ``index`` role), if one is configured."""
    return next((i.url for i in indexes if i.role == "index"), None)


def torch_index_template(indexes: list[Index]) -> str | None:
    """A configured PyTorch wheel index turned into a template with ``{variant}``:
    ``https://mirrors.aliyun.com/pytorch-wheels/cu121`` -> ``.../pytorch-wheels/{variant}``."""
    for index in indexes:
        if index.role == "find-links":
            continue
        match = _TORCH_VARIANT_SEGMENT.search(index.url)
        if match and ("torch" in index.url or "/whl/" in index.url):
            return index.url[: match.start()] + "/{variant}"
    return None


def is_remote(url: str) -> bool:
    """An index another machine can reach (a ``file://`` index or a path cannot be)."""
    return url.startswith(("http://", "https://"))


# -- pip ---------------------------------------------------------------------------------

_PIP_KEYS = {"index-url": "index", "extra-index-url": "extra-index", "find-links": "find-links"}


def _pip_env(env: Mapping[str, str]) -> Iterator[Index]:
    for key, role in _PIP_KEYS.items():
        name = "PIP_" + key.upper().replace("-", "_")
        for value in env.get(name, "").split():
            yield Index(strip_url(value), role, f"env {name}")


def _pip_config_paths(env: Mapping[str, str]) -> list[Path]:
    """pip's files in pip's own order, lowest precedence first."""
    xdg_dirs = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = Path(env.get("HOME", "~")).expanduser()
    xdg_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    paths = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    paths += [Path("/etc/pip.conf"), home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf",
              Path(sys.prefix) / "pip.conf"]
    explicit = env.get("PIP_CONFIG_FILE")
    if explicit and explicit != os.devnull:
        paths.append(Path(explicit))
    return paths


def _pip_file(path: Path) -> Iterator[Index]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return
    for section in ("install", "global"):  # pip lets [install] override [global]
        if not parser.has_section(section):
            continue
        for key, role in _PIP_KEYS.items():
            for value in parser.get(section, key, fallback="").split():
                yield Index(strip_url(value), role, f"pip config {path}")


# -- uv ----------------------------------------------------------------------------------

def _uv_env(env: Mapping[str, str]) -> Iterator[Index]:
    for name, role in (("UV_DEFAULT_INDEX", "index"), ("UV_INDEX_URL", "index"),
                       ("UV_INDEX", "extra-index"), ("UV_EXTRA_INDEX_URL", "extra-index"),
                       ("UV_FIND_LINKS", "find-links")):
        for value in re.split(r"[\s,]+", env.get(name, "").strip()):
            if value:
                yield Index(strip_url(_drop_index_name(value)), role, f"env {name}")


def _drop_index_name(value: str) -> str:
    """``UV_INDEX`` entries may be ``name=url``; the name is not part of the URL."""
    head = value.split("://", 1)[0]
    return value.split("=", 1)[1] if "=" in head else value


def _uv_config_paths(env: Mapping[str, str], project_dir: Path | None) -> list[tuple[Path, str]]:
    home = Path(env.get("HOME", "~")).expanduser()
    xdg_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    paths: list[tuple[Path, str]] = []
    if env.get("UV_CONFIG_FILE"):
        paths.append((Path(env["UV_CONFIG_FILE"]), ""))
    if project_dir is not None:
        paths += [(project_dir / "uv.toml", ""), (project_dir / "pyproject.toml", "tool.uv")]
    paths.append((xdg_home / "uv" / "uv.toml", ""))
    paths += [(Path(d) / "uv" / "uv.toml", "")
              for d in env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":") if d]
    paths.append((Path("/etc/uv/uv.toml"), ""))
    return paths


def _uv_files(env: Mapping[str, str], project_dir: Path | None) -> Iterator[Index]:
    for path, table in _uv_config_paths(env, project_dir):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        for part in table.split(".") if table else []:
            data = data.get(part, {}) if isinstance(data, dict) else {}
        if isinstance(data, dict):
            yield from _uv_table(data, f"uv config {path}")
            if isinstance(data.get("pip"), dict):
                yield from _uv_table(data["pip"], f"uv config {path}")


def _uv_table(data: dict, origin: str) -> Iterator[Index]:
    for entry in data.get("index", []) if isinstance(data.get("index"), list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("url"), str):
            role = "index" if entry.get("default") else "extra-index"
            yield Index(strip_url(entry["url"]), role, origin)
    for key, role in _PIP_KEYS.items():
        value = data.get(key)
        for url in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if isinstance(url, str):
                yield Index(strip_url(url), role, origin)

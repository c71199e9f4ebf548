"""Is a torch build published? Ask the package index, or look in the store's wheelhouse.

:func:`burst.env.torchvariant.choose` confirms a build before committing to it, because its
table cannot know the builds of torch releases after it was written. The probes here answer
"is ``torch==<version>+<variant>`` there?" with True, False, or None (cannot tell: the index
did not answer). They read a PEP 503 "simple" project page (``<index>/torch/``), the form
every pip index and mirror serves (PyTorch's ``download.pytorch.org/whl/<variant>``, Aliyun's
``pytorch-wheels/<variant>``, a devpi), or a list of wheel file names (a wheelhouse).
"""

from __future__ import annotations

import html
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from burst.env import torchvariant

_ANCHOR = re.compile(r"<a\s[^>]*href\s*=\s*[\"']([^\"']+)[\"'][^>]*>", re.IGNORECASE)

Probe = torchvariant.Probe


def _base(version: str) -> str:
    return version.partition("+")[0]


def wheel_matches(filename: str, version: str, variant: str, python: str | None = None) -> bool:
    """Whether ``filename`` is a torch wheel of ``version`` in build ``variant``.

    ``default`` is the index's own build (no local version tag); ``python`` ("3.10")
    requires a wheel for that CPython.
    """
    tag = _base(version) if variant == "default" else f"{_base(version)}+{variant}"
    if not filename.startswith(f"torch-{tag}-") or not filename.endswith(".whl"):
        return False
    if python is None:
        return True
    cp = "cp" + python.replace(".", "")
    return f"-{cp}-" in filename


def files_probe(names: Iterable[str], python: str | None = None) -> Probe:
    """A probe over wheel file names (a wheelhouse): True if one matches, else False."""
    held = [name.rsplit("/", 1)[-1] for name in names]

    def probe(version: str, variant: str) -> bool | None:
        return any(wheel_matches(name, version, variant, python) for name in held)

    return probe


def page_files(page: str) -> list[str]:
    """The file names a PEP 503 project page links to (``%2B`` decoded, hash fragment cut)."""
    names = []
    for href in _ANCHOR.findall(page):
        path = urllib.parse.urlsplit(html.unescape(href)).path
        names.append(urllib.parse.unquote(path.rsplit("/", 1)[-1]))
    return names


def index_probe(template: str, python: str | None = None, timeout: float = 10.0) -> Probe:
    """A probe asking the index ``template`` (``.../whl/{variant}``, or one fixed index URL).

    A missing project page (HTTP 404) means the build is not there; any other failure
    means the probe cannot tell. Pages are fetched once per URL.
    """
    pages: dict[str, list[str] | None] = {}

    def files(url: str) -> list[str] | None:
        if url not in pages:
            pages[url] = _fetch(url, timeout)
        return pages[url]

    def probe(version: str, variant: str) -> bool | None:
        index = template.format(variant=variant) if "{variant}" in template else template
        listed = files(index.rstrip("/") + "/torch/")
        if listed is None:
            return None
        return any(wheel_matches(name, version, variant, python) for name in listed)

    return probe


def _fetch(url: str, timeout: float) -> list[str] | None:
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return page_files(response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return [] if error.code == 404 else None
    except (OSError, ValueError):
        return None


def either(*probes: Probe) -> Probe:
    """True if any probe finds the build, False if every one says it is absent, else None."""

    def probe(version: str, variant: str) -> bool | None:
        answers = [p(version, variant) for p in probes]
        if any(answers):
            return True
        return None if any(a is None for a in answers) else False

    return probe


def for_release(torch_version: str, template: str, python: str | None = None,
                wheelhouse: Path | None = None, timeout: float = 10.0) -> Probe | None:
    """The probe to plan an install of ``torch_version`` with: None for a release in the
    table (its builds are known), else the wheelhouse's files first, then the index."""
    if torchvariant.in_table(torch_version):
        return None
    index = index_probe(template, python, timeout)
    if wheelhouse is None or not wheelhouse.is_dir():
        return index
    return either(files_probe([p.name for p in wheelhouse.iterdir()], python), index)

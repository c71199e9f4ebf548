"""A wheelhouse's index: the JSON that names a lockfile's wheels, and what is missing.

Each lockfile of a run gets one, ``<run>/env/wheelhouse-<lock digest>.json``, written
after its wheels (a reader that finds it finds every wheel it names); a downloaded
wheelhouse keeps a copy beside its wheels. The node's bootstrap reads the same file with
the standard library alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from burst.env.wheelhouse.house import FORMAT, Wheelhouse, WheelhouseError, parse_name
from burst.store.base import Store, check_key
from burst.store.retry import retrying

INDEX_FILE = "wheelhouse.json"  # the index, beside the wheels of a downloaded wheelhouse


def index_key(run_id: str, digest: str) -> str:
    return check_key(f"{run_id}/env/wheelhouse-{digest}.json")


def dumps(data: dict[str, Any]) -> bytes:
    """An index as stored: sorted keys, so the same wheelhouse writes the same bytes."""
    return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()


def load_index(store: Store, run_id: str, digest: str) -> dict[str, Any] | None:
    """The wheelhouse index of a run's lockfile, or None when it has none."""
    store = retrying(store)
    try:
        data = json.loads(store.get(index_key(run_id, digest)))
    except KeyError:
        return None
    except ValueError as error:
        raise WheelhouseError(f"wheelhouse index of {run_id} is not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WheelhouseError(f"wheelhouse index of {run_id} has an unknown format: upgrade "
                              f"burst")
    return data


def read_local(directory: Path) -> dict[str, Any] | None:
    """The index of a downloaded wheelhouse directory, or None."""
    try:
        return json.loads((directory / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return None


def wheels_in(directory: Path) -> dict[str, str]:
    """``{name: version}`` of the wheels in a directory (a downloaded wheelhouse)."""
    out = {}
    for path in sorted(directory.glob("*.whl")):
        parsed = parse_name(path.name)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def summary(house_or_index: Wheelhouse | dict[str, Any]) -> dict[str, Any]:
    """Counts and bytes by role, for printing."""
    index = house_or_index.index() if isinstance(house_or_index, Wheelhouse) else house_or_index
    roles: dict[str, dict[str, int]] = {}
    for w in index.get("wheels", []):
        entry = roles.setdefault(w["role"], {"wheels": 0, "bytes": 0})
        entry["wheels"] += 1
        entry["bytes"] += int(w["size"])
    return {"wheels": len(index.get("wheels", [])),
            "bytes": sum(int(w["size"]) for w in index.get("wheels", [])),
            "roles": roles, "missing": index.get("missing", []), "target": index.get("target")}

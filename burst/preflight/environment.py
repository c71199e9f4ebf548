"""Is the run's environment record complete, and does its wheelhouse hold every wheel?

The node builds its software from the store alone (a Beijing box reaches no package
index), so the lockfile the run resumes with must be there, its wheelhouse index too, no
pin may be missing from it (except those the wheel policy leaves to a mirror on purpose),
and every wheel it names must be in the store at the size the index says: an upload that
died halfway leaves a wheel short, which the node would only find out while installing.
"""

from __future__ import annotations

from burst.env import freeze, interpreter, wheelhouse
from burst.errors import BurstError
from burst.preflight.table import FAIL, OK, WARN, Row
from burst.store.base import Store

ENVIRONMENT, WHEELHOUSE, NODE_PYTHON = "environment record", "wheelhouse", "node python"
POLICY_NOTE = "policy "  # how the index words a pin left to a mirror on purpose


def environment_rows(store: Store, run_id: str) -> list[Row]:
    """The environment row and the wheelhouse row for ``run_id``."""
    try:
        lock, code_ref = freeze.load_frozen(store, run_id)
    except BurstError as error:
        return [Row(ENVIRONMENT, FAIL, str(error), f"run `burst freeze {run_id}` where it "
                    "trains"),
                Row(WHEELHOUSE, FAIL, "no lockfile, so no wheelhouse to check",
                    f"run `burst freeze {run_id}` where it trains")]
    code = "and its code archive" if code_ref else "(no code archive: the node needs the code)"
    env_row = Row(ENVIRONMENT, OK if code_ref else WARN,
                  f"lockfile {lock.digest[:12]} ({len(lock.packages)} packages) {code}",
                  "" if code_ref else f"run `burst freeze {run_id}` in the project's directory")
    return [env_row, wheelhouse_row(store, run_id, lock.digest), node_python_row(store, run_id)]


def node_python_row(store: Store, run_id: str) -> Row:
    """How a node gets the lock's Python: from its image, from the store (shipped), or
    with uv from the internet or a mirror (a warning: a node in mainland China may reach
    neither)."""
    try:
        chosen = interpreter.for_run(store, run_id)
    except BurstError as error:
        return Row(NODE_PYTHON, FAIL, str(error), f"unset ${interpreter.EXPLICIT_ENV} or "
                   "point it at a CPython install directory")
    line = interpreter.describe(chosen)
    if chosen is None or chosen.kind != "uv":
        return Row(NODE_PYTHON, OK, line)
    return Row(NODE_PYTHON, WARN, line, f"run `uv python install {chosen.python}` here: "
               "burst resume then ships it in the store")


def wheelhouse_row(store: Store, run_id: str, digest: str) -> Row:
    """Every wheel of the lockfile's wheelhouse present in the store, at its size."""
    fix = f"run `burst push {run_id}` (or `burst freeze {run_id}`) where it trains"
    try:
        index = wheelhouse.load_index(store, run_id, digest)
    except BurstError as error:
        return Row(WHEELHOUSE, FAIL, str(error), fix)
    if index is None:
        return Row(WHEELHOUSE, FAIL, f"no wheelhouse for lockfile {digest[:12]}: the node would "
                   "need a package index", fix)
    wheels = index.get("wheels", [])
    absent, short = [], []
    for wheel in wheels:
        size = store.size(wheelhouse.wheel_key(wheel["sha256"], wheel["file"]))
        if size is None:
            absent.append(wheel["file"])
        elif size != int(wheel["size"]):
            short.append(f"{wheel['file']} ({size} of {wheel['size']} bytes)")
    missing = [m for m in index.get("missing", [])
               if not str(m.get("why", "")).startswith(POLICY_NOTE)]
    left_out = [m for m in index.get("missing", []) if m not in missing]
    target = index.get("target") or {}
    where = f"python {target.get('python', '?')} {target.get('machine', '?')}"
    problems = ([f"not in the store: {', '.join(absent)}"] if absent else []) + (
        [f"wrong size: {', '.join(short)}"] if short else []) + (
        [f"missing from the index: {', '.join(_named(m) for m in missing)}"] if missing else [])
    if problems:
        return Row(WHEELHOUSE, FAIL, f"for {where}: " + "; ".join(problems), fix)
    note = (f"; left to a mirror by policy: {', '.join(_named(m) for m in left_out)}"
            if left_out else "")
    return Row(WHEELHOUSE, OK, f"{len(wheels)} wheels for {where}, all in the store{note}")


def _named(entry: dict) -> str:
    return f"{entry.get('name')} {entry.get('version', '')}".strip()

"""The package's shape as a specification: imports flow one way, no module reaches into
another's private names, and the folders are the map (few modules at the top)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "burst"
TOP_LEVEL_LIMIT = 8


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _private_imports(name: str, path: Path) -> list[str]:
    """``from burst.x import _name`` (or ``import burst.x._y``) of another module's private."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("burst"):
            if node.module == name:
                continue
            found += [f"{name}: from {node.module} import {alias.name}"
                      for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [f"{name}: import {alias.name}" for alias in node.names
                      if alias.name.startswith("burst")
                      and any(p.startswith("_") and not p.startswith("__")
                              for p in alias.name.split("."))]
    return found


def test_no_module_imports_another_modules_private_names():
    offenders = [line for name, path in _modules().items()
                 for line in _private_imports(name, path)]
    assert offenders == []


def test_no_import_cycles_among_burst_modules():
    tool = ROOT.parent / "shared" / "tools" / "import_cycles.py"
    assert tool.exists(), f"the shared cycle checker is missing: {tool}"
    result = subprocess.run([sys.executable, str(tool), str(PACKAGE)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_library_never_imports_the_cli():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("burst.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if (module and module.startswith("burst.cli")) or \
                    any(n.startswith("burst.cli") for n in names):
                offenders.append(name)
    assert offenders == []


def test_few_modules_sit_directly_under_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


# Private members of *other libraries* that burst must use, each for a stated reason.
FOREIGN_PRIVATE = {
    "os._exit",  # leave at once after an emergency snapshot, skipping atexit and finalizers
    "epoch_loop._batches_that_stepped",  # Lightning keeps its optimizer-step count there
    # transformers' Trainer keeps the loss it has summed since its last log there: a resume
    # mid-window restores it so the logged loss equals an uninterrupted run's
    "trainer._tr_loss",
    "trainer._total_loss_scalar",
    "trainer._globalstep_last_logged",
}


def test_no_module_drives_another_object_through_private_members():
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") \
                    or node.attr.startswith("__"):
                continue
            reach = f"{ast.unparse(node.value)}.{node.attr}"
            # super() is the object itself: a subclass overriding its parent's hook
            if ast.unparse(node.value) not in ("self", "cls", "super()") \
                    and reach not in FOREIGN_PRIVATE:
                offenders.append(f"{name}:{node.lineno}: {reach}")
    assert offenders == []


# The layers, from the leaves up (why each sits where it does: see the test below).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "config", "contract", "killpoints", "redact"),
    ("store",),
    ("events",),
    ("snapshot",),
    ("staging",),
    ("inputs",),
    ("env", "plan"),
    ("state",),
    ("parallel",),
    ("training",),
    ("integrations",),
    ("supervise",),
    ("node",),
    ("launch",),
    ("resume", "deadline", "preflight", "report"),
    ("burst",),
    ("cli",),
)
ROOT_METADATA = ("__version__", "__file__")


def _layer_of(module: str) -> str:
    """``burst.x.y`` -> ``x``; the package itself -> ``burst``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "burst"


def _burst_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """Every module of burst that ``name`` imports, wherever the import sits (a lazy one in a
    function counts: it is a dependency all the same), as (line, module). Reading the package
    itself only for its version or location (``import burst`` for ``burst.__file__``,
    ``from burst import __version__``) runs only its lazy ``__init__``, so it is no
    dependency on the façade."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names
                      if alias.name.startswith("burst.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "burst" or node.module.startswith("burst.")):
            for alias in node.names:
                if node.module == "burst" and alias.name in ROOT_METADATA:
                    continue
                full = f"{node.module}.{alias.name}"  # a submodule, or a name in the module
                found.append((node.lineno, full if full in modules else node.module))
    return sorted(set(found))


def _rank() -> dict[str, int]:
    return {package: level for level, packages in enumerate(LAYERS) for package in packages}


def _inversions(modules: dict[str, Path]) -> list[str]:
    rank = _rank()
    found = []
    for name, path in sorted(modules.items()):
        layer = _layer_of(name)
        for line, imported in _burst_imports(name, path, modules):
            target = _layer_of(imported)
            if target != layer and rank[target] > rank[layer]:
                found.append(f"{name}:{line} imports {imported}: layer {layer!r} (level "
                             f"{rank[layer]}) reaches up to layer {target!r} (level "
                             f"{rank[target]})")
    return found


def test_every_package_has_a_place_in_the_layers():
    rank = _rank()
    unplaced = sorted({_layer_of(name) for name in _modules()} - set(rank))
    assert unplaced == [], f"add these to LAYERS in {Path(__file__).name}: {unplaced}"


def test_imports_flow_one_way_from_the_leaves_up():
    """A package imports its own layer and those below it, never one above; lazy imports
    count. The issue's order (errors/config/contract < store < snapshot < state < parallel <
    training < supervise < env/plan < launch/node/resume/deadline/preflight/report < cli),
    refined where the code shows which way the arrows run:

    - the leaves: errors, config, contract, killpoints and redact import nothing of burst
      but errors; events sits just above store, as it appends a run's history through the
      Store protocol.
    - env, plan and inputs sit above snapshot, below state: they need only store and
      snapshot, while a training Run freezes and stages its environment and inputs as it
      trains (env.freeze, env.stager, inputs.part) and its memory control asks the planner
      for the exact micro-batch splits (plan.planner). Nothing of state, parallel, training
      or supervise is imported by them.
    - inputs sits below env, not beside it: the run's inputs are one of the parts the
      environment stages (env.freeze stages them with the code, env.stageparts hands them
      to the background stager), so env imports inputs; inputs never imports env, or the
      two would be one tangle that neither can be read or tested without the other.
    - staging sits below both: what both of them stage with from a training process's
      thread (the Part protocol with Pending and Throttle, spawn's fork-safe git and pip,
      where the wheel cache lies, whose reads are never inputs). It needs only store.
    - integrations sits just above training: it adapts foreign loops (Lightning, Accelerate,
      transformers' Trainer) onto a Run and imports only training, state and the leaves;
      nothing in burst imports it.
    - node (what runs on the node: the bootstrap, the restart bound) sits below launch,
      which renders it into the task; launch sits below resume and preflight, which drive
      launchers.
    - the package's own ``__init__`` is the lazy public façade (Run, the samplers,
      input_path), just below the CLI."""
    assert _inversions(_modules()) == []

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

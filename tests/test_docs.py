"""The reference site builds without a broken link, and its CLI page covers every command."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from burst.cli import main as burst_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def every_command(group: click.Group, prefix: str = "burst") -> list[tuple[str, click.Command]]:
    ctx = click.Context(group)
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        found.append((f"{prefix} {name}", command))
        if isinstance(command, click.Group):
            found.extend(every_command(command, f"{prefix} {name}"))
    return found


def test_the_site_builds_in_strict_mode(site: Path) -> None:
    assert (site / "index.html").exists()


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    page = html.unescape((site / "cli" / "index.html").read_text(encoding="utf-8"))
    missing = []
    for path, command in every_command(burst_command):
        anchor = 'id="' + path.replace(" ", "-") + '"'
        if anchor not in page:
            missing.append(path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                missing.extend(f"{path} {opt}" for opt in param.opts if opt not in page)
    assert not missing


def test_the_api_reference_documents_the_run(site: Path) -> None:
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "burst.training.run.Run" in page and "attach" in page


def test_the_quick_start_page_shows_the_walk_through_the_readme_tests() -> None:
    def walk_through(path: Path) -> str:
        return re.findall(r"```bash\n(export PATH.*?)```", path.read_text(), flags=re.S)[0]

    assert walk_through(ROOT / "docs" / "quickstart.md") == walk_through(ROOT / "README.md")


def test_the_own_loop_page_shows_the_lines_its_tested_scripts_run() -> None:
    """Every line marked ``# burst`` in the page's examples is a line of the script that
    tests/training/test_own_loops.py kills and restarts, so the page cannot drift."""
    page = (ROOT / "docs" / "own-loop.md").read_text()
    scripts = "\n".join((ROOT / "scripts" / name).read_text()
                        for name in ("example_nanogpt.py", "example_lstm.py"))
    script_lines = {line.strip() for line in scripts.splitlines()}
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    marked = [line.strip() for block in blocks for line in block.splitlines()
              if "# burst" in line]
    assert len(marked) >= 10
    assert [line for line in marked if line not in script_lines] == []

"""Output without a terminal (CI logs, ``| tee``): tables whole, messages on one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.cli.console import make_console
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest

RUN = "a-run-whose-name-is-longer-than-any-terminal-would-leave-room-for-in-a-title-" + "x" * 40


@pytest.fixture(autouse=True)
def no_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Nothing tells rich there is a terminal, or how wide one is; no user config."""
    for name in ("COLUMNS", "FORCE_TERMINAL", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "no-config.toml"))


def test_a_table_is_whole_when_stdout_is_not_a_terminal(tmp_path) -> None:
    store = str(tmp_path / "store")
    put_manifest(open_store(store), manifest(RUN, peaks={8: 3 * GIB, 16: 5 * GIB},
                                             card="NVIDIA L4", reason="oom"))
    result = CliRunner().invoke(main, ["plan", RUN, "--store", store, "--offline",
                                       "--gpu", "A100,L40S,H100", "--infra", "aws/us-east-1"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    header = next(line for line in result.output.splitlines() if "card" in line)
    for column in ("micro", "accum", "peak / budget", "to finish", "where"):
        assert column in header
    assert RUN in result.output and "aws/us-east-1" in result.output


def test_a_long_message_stays_on_one_line_when_stderr_is_not_a_terminal(capsys) -> None:
    message = "burst: run oom-kept finished at local:" + "/nodes" * 30
    make_console(stderr=True).print(message)
    assert capsys.readouterr().err == message + "\n"

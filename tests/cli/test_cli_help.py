"""Every command explains itself: an example in its --help, and the example parses."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.cli.examples import EXAMPLES


@pytest.mark.parametrize("name", main.list_commands(click.Context(main)))
def test_every_command_shows_an_example_in_its_help(name):
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0 and "Example" in result.output


def parse(argv: list[str]) -> None:
    """Parse argv down to the last subcommand without running anything."""
    command: click.Command = main
    context = main.make_context("burst", list(argv), resilient_parsing=False)
    args = context.protected_args + context.args
    while isinstance(command, click.Group) and args:
        _name, command, args = command.resolve_command(context, args)
        context = command.make_context(_name, list(args), parent=context)
        args = (context.protected_args + context.args) if isinstance(command, click.Group) else []


@pytest.mark.parametrize("line", [line for lines in EXAMPLES.values() for line in lines])
def test_every_example_uses_options_that_exist(line):
    argv = shlex.split(line)
    assert argv[0] == "burst"
    parse(argv[1:])

"""A click group that imports a command's module only when that command is used.

``burst --help`` and ``burst ls`` must start in a blink, so the group is built from a
table (name -> ``"module:attribute"`` and the command's short help) instead of from
imported commands: listing the commands reads the table, and a module is imported only
when its command runs or shows its own help (click's documented LazyGroup pattern). A
test keeps each table entry's short help equal to the real command's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import click

# Wide enough that a command's short help is never cut: the table holds it whole, and the
# help page cuts it to the terminal exactly as click would have.
FULL_WIDTH = 10_000


class Entry(NamedTuple):
    """Where a command lives (``"package.module:attribute"``) and its short help."""

    target: str
    short_help: str


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use, from ``lazy`` entries.

    ``prepare`` runs once on each command when it is loaded (e.g. to add an epilog).
    """

    def __init__(self, *args: Any, lazy: Mapping[str, Entry] | None = None,
                 prepare: Callable[[click.Command], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Entry] = dict(lazy or {})
        self.prepare = prepare

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self.load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def load(self, name: str) -> click.Command:
        """Import ``name``'s module and return its command (prepared, not yet added)."""
        module_name, _, attribute = self.lazy[name].target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[name].target} is not a click command")
        if self.prepare is not None:
            self.prepare(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their short help, from the table: nothing is imported."""
        rows = [(name, self._short_help(name)) for name in self.list_commands(ctx)
                if name in self.lazy or not self.commands[name].hidden]
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(name, _shortened(name, text, limit)) for name, text in rows])

    def _short_help(self, name: str) -> str:
        if name in self.lazy:
            return self.lazy[name].short_help
        return self.commands[name].get_short_help_str(FULL_WIDTH)


def _shortened(name: str, text: str, limit: int) -> str:
    """``text`` cut to ``limit`` as click cuts a command's help (click 8.5 deprecated its
    ``make_default_short_help``, and click 9 drops it: a command does it instead)."""
    return click.Command(name, help=text).get_short_help_str(limit)

"""The ``burst`` command: a click group whose subcommands live one module each.

Each command parses its flags, calls the library and prints. Expected failures arrive as
``BurstError`` and are shown as one ``Error: ...`` line with a non-zero exit code; only a
bug in burst itself can produce a traceback.
"""

from __future__ import annotations

import click

from burst import __version__
from burst.errors import BurstError


class UserFacingError(click.ClickException):
    def __init__(self, error: BurstError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code


class BurstGroup(click.Group):
    """Turns every ``BurstError`` a command raises into a one-line error and exit code."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except BurstError as error:
            raise UserFacingError(error) from None


@click.group(cls=BurstGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burst")
def main() -> None:
    """Keep a PyTorch training run alive when its GPU fails.

    burst snapshots a run's whole training state, keeps it safe in a store, and resumes it
    exactly: on the same machine, or on a bigger card in the cloud.
    """


def _register() -> None:
    from burst.cli import env, gc, plan, snapshots, transfer
    from burst.cli import run as run_commands

    for command in (*snapshots.COMMANDS, *plan.COMMANDS, *env.COMMANDS, *transfer.COMMANDS,
                    *gc.COMMANDS, *run_commands.COMMANDS):
        main.add_command(command)


_register()

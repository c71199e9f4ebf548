"""The ``burst`` command: a click group whose subcommands live one module each.

Each command parses its flags, calls the library and prints. Expected failures arrive as
``BurstError`` and are shown as one ``Error: ...`` line with a non-zero exit code. An
``OSError`` (a path that cannot be read or written) is one line too. Anything else is a
bug in burst: the user gets one line naming a log file, which holds the traceback
(:mod:`burst.crashlog`), and exit code 70. Every line is stripped of URL credentials.
"""

from __future__ import annotations

import click

from burst import __version__
from burst.cli import crashlog
from burst.env.redact import scrub_text
from burst.errors import BurstError

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in burst, not in what the user asked


class UserFacingError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(_one_line(message))
        self.exit_code = exit_code


class BurstGroup(click.Group):
    """Turns every exception a command raises into a one-line error and an exit code."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BurstError as error:
            raise UserFacingError(str(error), error.exit_code) from None
        except OSError as error:
            raise UserFacingError(_os_error(error)) from None
        except Exception as error:
            raise UserFacingError(_internal(error), EXIT_INTERNAL) from None


def _os_error(error: OSError) -> str:
    where = f": {error.filename}" if error.filename else ""
    return f"{error.strerror or error}{where}"


def _internal(error: Exception) -> str:
    path = crashlog.write(error)
    what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    where = f"the traceback is in {path}" if path else "no log could be written"
    return f"internal error in burst ({what[:200]}); {where}; please report it"


def _one_line(message: str) -> str:
    return scrub_text(" ".join(message.split()))


@click.group(cls=BurstGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burst")
def main() -> None:
    """Keep a PyTorch training run alive when its GPU fails.

    burst snapshots a run's whole training state, keeps it safe in a store, and resumes it
    exactly: on the same machine, or on a bigger card in the cloud.
    """


def _register() -> None:
    from burst.cli import env, gc, plan, snapshots, transfer
    from burst.cli import report as report_commands
    from burst.cli import resume as resume_commands
    from burst.cli import run as run_commands
    from burst.cli import schedule as schedule_commands
    from burst.cli import status as status_commands
    from burst.cli.examples import add_examples

    for command in (*snapshots.COMMANDS, *plan.COMMANDS, *env.COMMANDS, *transfer.COMMANDS,
                    *gc.COMMANDS, *run_commands.COMMANDS, *schedule_commands.COMMANDS,
                    *resume_commands.COMMANDS, *status_commands.COMMANDS,
                    *report_commands.COMMANDS):
        add_examples(command)
        main.add_command(command)


_register()

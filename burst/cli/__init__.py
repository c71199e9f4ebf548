"""The ``burst`` command: a click group whose subcommands live one module each.

Each command parses its flags, calls the library and prints. Expected failures arrive as
``BurstError`` and are shown as one ``Error: ...`` line with a non-zero exit code. An
``OSError`` (a path that cannot be read or written) is one line too. Anything else is a
bug in burst: the user gets one line naming a log file, which holds the traceback
(:mod:`burst.cli.crashlog`), and exit code 70. Every line, click's own usage errors
included, is stripped of credentials (URL user info, malformed URLs too, and signature,
token and password parameters: :func:`burst.redact.scrub_text`).
"""

from __future__ import annotations

import click

from burst import __version__
from burst.cli.examples import add_examples
from burst.cli.lazy import Entry, LazyGroup
from burst.errors import BurstError

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in burst, not in what the user asked


class UserFacingError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(_one_line(message))
        # click declares the code per class but reads it off the instance: ours varies
        self.exit_code = exit_code  # type: ignore[misc]


class BurstGroup(LazyGroup):
    """Turns every exception a command raises into a one-line error and an exit code.

    Its commands load on use (:mod:`burst.cli.lazy`): the table below names each one's
    module and short help, so ``burst --help`` imports none of them.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.ClickException as error:  # click's own messages echo what was typed
            # final to click's typing, but click prints what the instance holds then
            error.message = _scrubbed(error.message)  # type: ignore[misc]
            raise
        except (click.exceptions.Exit, click.Abort):
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
    from burst.cli import crashlog  # loads on a bug only: `burst --help` starts quicker

    path = crashlog.write(error)
    what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    where = f"the traceback is in {path}" if path else "no log could be written"
    # scrubbed before it is cut: a URL cut in half would no longer look like one
    return f"internal error in burst ({_one_line(what)[:200]}); {where}; please report it"


def _one_line(message: str) -> str:
    from burst.cli.console import shown  # a store's words in an error: displayed, not acted on

    return shown(_scrubbed(" ".join(message.split())))


def _scrubbed(message: str) -> str:
    from burst.redact import scrub_text  # its patterns compile on the first error

    return scrub_text(message)


# name -> where the command lives and its short help (tests/cli/test_startup.py keeps the
# short help equal to the command's own, and the table equal to each module's COMMANDS)
COMMANDS: dict[str, Entry] = {
    "check": Entry("burst.cli.check:check_command",
                   "Check that a burst would work now: store access, credentials, environment "
                   "and wheelhouse, SkyPilot, SSH targets, a place to run and local disk."),
    "drill": Entry("burst.cli.run:drill",
                   "Run a training command under an injected fault and report what was lost."),
    "env": Entry("burst.cli.env:env_group", "Rebuild or check a run's frozen environment."),
    "freeze": Entry("burst.cli.env:freeze_command",
                    "Record the environment and code of RUN_ID in its store."),
    "gc": Entry("burst.cli.gc:gc", "Delete RUN_ID's snapshots outside the retention rule, "
                "then blobs nothing keeps."),
    "ls": Entry("burst.cli.snapshots:list_snapshots",
                "List the runs in the store, or RUN_ID's complete snapshots, oldest first."),
    "node": Entry("burst.cli.resume:node_group",
                  "What a resumed run's task runs on its node (set up by burst resume)."),
    "plan": Entry("burst.cli.plan:plan_command",
                  "Rank where RUN_ID could continue: card, count, place, spot, micro-batch, "
                  "accumulation, precision, predicted memory, price and time to finish."),
    "pull": Entry("burst.cli.transfer:pull", "Download RUN_ID's newest intact snapshot, every "
                  "blob hash-checked, into the local tier."),
    "push": Entry("burst.cli.transfer:push", "Upload RUN_ID's snapshot(s) from the local tier; "
                  "blobs already there are skipped."),
    "report": Entry("burst.cli.report:report",
                    "Write an HTML report of RUN: loss, throughput and GPU memory over time, "
                    "each snapshot, failure and resume, and where the run went."),
    "resume": Entry("burst.cli.resume:resume_command",
                    "Continue RUN_ID elsewhere from its newest snapshot: burst resume RUN --to "
                    "local [-- python train.py ...] (default command: the one the agent last "
                    "ran)."),
    "run": Entry("burst.cli.run:run_command",
                 "Supervise a training command: burst run --run-id R -- python train.py ..."),
    "schedule": Entry("burst.cli.schedule:schedule_command",
                      "Keep RUN_ID backed up until a deadline, and burst to the cloud early if "
                      "the local run will not finish in time (spot while slack remains, "
                      "on-demand after)."),
    "show": Entry("burst.cli.snapshots:show",
                  "Print a snapshot's manifest (without its state tree) as JSON."),
    "status": Entry("burst.cli.status:status_command",
                    "Where RUN_ID is (local, a cluster, a host), its last snapshot and age, "
                    "pending uploads, the last failure and the plan in force."),
    "verify": Entry("burst.cli.snapshots:verify", "Check a snapshot's manifest and every "
                    "blob's size and hash (reads every byte)."),
}


@click.group(cls=BurstGroup, lazy=COMMANDS, prepare=add_examples,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burst")
def main() -> None:
    """Keep a PyTorch training run alive when its GPU fails.

    burst snapshots a run's whole training state, keeps it safe in a store, and resumes it
    exactly: on the same machine, or on a bigger card in the cloud.
    """

"""Running pip (or uv) for the wheelhouse, and reading why it failed.

The wheelhouse is built in the freeze thread of a training process whose DataLoader may
fork at any moment, so its helper programs run through :mod:`burst.staging.spawn` (a
``subprocess`` pipe inherited by a forked worker would hang that thread for good), and
their end is read as text with a timeout counted as a failure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from burst.staging import spawn

# pip downloads torch with its CUDA libraries (3-4 GB) on a slow link: generous, not endless
PIP_TIMEOUT = 3 * 3600.0


@dataclass(frozen=True)
class Ran:
    """A helper program's end as the wheelhouse reads it (text, a timeout as a failure)."""

    returncode: int
    stdout: str
    stderr: str


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> Ran:
    """Run pip (or uv) through :mod:`burst.staging.spawn`: never a pipe a forked worker keeps."""
    done = spawn.run(argv, timeout=timeout, env=env)
    stderr = done.stderr.decode(errors="replace")
    if done.returncode is None:
        stderr += f"\n{argv[0]} did not finish within {timeout:.0f} s"
    return Ran(-1 if done.returncode is None else done.returncode,
               done.stdout.decode(errors="replace"), stderr)


def command() -> list[str]:
    """This interpreter's pip: the one whose configuration (indexes, proxies) the user set."""
    return [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def reason(output: str) -> str:
    """pip's own reason: its first ``ERROR:`` line that names one, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")
              and "ResolutionImpossible" not in line]
    return (errors[0] if errors else lines[-1] if lines else "pip failed")[:300]

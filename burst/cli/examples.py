"""One worked example per command, shown at the end of its ``--help``.

Kept in one table so the examples read as a set (same run names, same store) and a test
can check that no command ships without one.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, list[str]] = {
    "ls": ["burst ls", "burst ls my-run --store s3://ckpt/runs --json"],
    "show": ["burst show my-run --step 1200"],
    "verify": ["burst verify my-run --all --store oss://ckpt/runs --region oss-cn-beijing"],
    "push": ["burst push my-run --store s3://ckpt/runs"],
    "pull": ["burst pull my-run --store s3://ckpt/runs --local ./.burst"],
    "gc": ["burst gc my-run --store s3://ckpt/runs --keep-last 3 --keep-every 1000 --dry-run"],
    "run": ["burst run --run-id my-run --on-oom retry-smaller -- python train.py"],
    "drill": ["burst drill --fault oom@120 --run-id my-run -- python train.py"],
    "plan": ["burst plan my-run --gpu A100-80GB,H100 --region beijing --after-oom"],
    "resume": ["burst resume my-run --to skypilot --gpu A100-80GB,H100 --dry-run",
               "burst resume my-run --to ssh://me@gpu-box:22"],
    "status": ["burst status my-run --store s3://ckpt/runs"],
    "schedule": ["burst schedule my-run --deadline 2026-12-03T18:00+08:00 --every 30m "
                 "--store oss://ckpt/runs"],
    "freeze": ["burst freeze my-run --store s3://ckpt/runs"],
    "env": ["burst env check my-run", "burst env install my-run --venv ~/burst-env"],
    "node": ["burst node setup --venv ~/burst-env", "burst node run -- python train.py"],
}


def add_examples(command: click.Command) -> None:
    """Append the command's example to its help unless its own docstring has one."""
    lines = EXAMPLES.get(command.name or "")
    if not lines or "Example" in (command.help or ""):
        return
    block = "\n".join(f"  {line}" for line in lines)
    if command.name == "node":
        block += "\n  (inside a burst task: $BURST_RUN_ID and $BURST_STORE are set)"
    command.epilog = f"\b\nExample{'s' if len(lines) > 1 else ''}:\n{block}"

"""Train, kill with SIGKILL mid-step, resume by running the same command again, compare.

Two runs of ``example_train.py`` go side by side into a local store: one never stops,
the other is killed in the middle of a gradient-accumulation window and then simply
started again. burst restores it from its newest snapshot, and at the end every
parameter, optimizer and scheduler value, every loss and every sample index matches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

EXAMPLE = Path(__file__).with_name("example_train.py")
console = Console()


def train(workdir: Path, run_id: str, *extra: str) -> int:
    cmd = [sys.executable, str(EXAMPLE), "--run-id", run_id, "--store", str(workdir / "store"),
           "--records", str(workdir / f"{run_id}.jsonl"), "--final", str(workdir / f"{run_id}.pt"),
           "--workers", "2", "--scaler", *extra]
    console.print(f"[dim]$ {' '.join(cmd[1:])}[/dim]")
    return subprocess.run(cmd, check=False).returncode


def steps_of(path: Path) -> list[dict]:
    latest: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        latest[record["step"]] = record  # a replayed step overwrites the killed attempt's
    return [latest[k] for k in sorted(latest)]


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kill-at", default="8:1", help="STEP:MICRO where the run is killed")
    parser.add_argument("--keep", action="store_true", help="keep the demo's files")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="burst-demo-"))
    console.rule("1. a reference run that never stops")
    train(workdir, "reference")
    console.rule(f"2. the same run, killed with SIGKILL at step:micro-batch {args.kill_at}")
    code = train(workdir, "crashy", "--kill-at", args.kill_at)
    console.print(f"exit code {code} (killed)" if code < 0 else f"exit code {code}")
    console.rule("3. run the same command again: burst restores and continues")
    train(workdir, "crashy")
    reference, resumed = steps_of(workdir / "reference.jsonl"), steps_of(workdir / "crashy.jsonl")
    final_ref = torch.load(workdir / "reference.pt", weights_only=True)
    final_res = torch.load(workdir / "crashy.pt", weights_only=True)
    table = Table(title="resumed run vs uninterrupted run")
    table.add_column("what")
    table.add_column("identical")
    checks = {
        "sample indices of every step": [r["indices"] for r in reference] == [r["indices"] for r in resumed],
        "loss of every step (bits)": [r["loss"] for r in reference] == [r["loss"] for r in resumed],
        **{f"final {k} state": same(final_ref[k], final_res[k]) for k in final_ref},
    }
    for what, ok in checks.items():
        table.add_row(what, "[green]yes[/green]" if ok else "[red]NO[/red]")
    console.print(table)
    console.print(f"snapshots: [bold].venv/bin/burst ls crashy --store {workdir / 'store'}[/bold]"
                  if args.keep else "")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

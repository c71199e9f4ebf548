"""The own-loop crash tests' worker: one example script, SIGKILLed at five points.

Run as ``python -m tests.helpers.loop_harness --script nanogpt --work DIR --out F``. Like
``tests/helpers/crash_harness.py``, the parent imports torch and burst once and starts no thread,
then forks a child for each run of the script (its ``main``, with the run's environment):
a fresh interpreter per run would cost seconds, a fork tens of milliseconds. A child
killed by a ``BURST_FAULT`` drill or a ``BURST_KILLPOINT`` dies by SIGKILL, as the OOM
killer or a preempted VM would leave it; the next child re-runs the same script against
the same store, as a user restarting it would.

For each scenario the worker writes the runs' exit codes and the hidden temporaries each
left in the store; the records (loss bits per
step, a re-run step replacing the killed attempt's), the final state and each run's
stderr lie under ``DIR/<scenario>``. The test compares them with the uninterrupted run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("BURST_FREEZE", "0")  # the environment freeze is not under test here
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@dataclass(frozen=True)
class Script:
    """An example script, the words of data it trains on, and its last step."""

    file: str
    data_size: int
    last_step: int
    last_micro: int  # the last step's last micro-batch (a partial step may have fewer)


SCRIPTS_UNDER_TEST = {
    "nanogpt": Script("example_nanogpt.py", 4000, last_step=12, last_micro=1),
    "lstm": Script("example_lstm.py", 120, last_step=16, last_micro=0),
}
PERSIST_START = "snapshot.marker-written"  # a persist's first point of its own
PERSIST_POINT = "snapshot.blob"  # a blob of the second persist is being written: kill there


def scenarios(script: Script, killpoint: str) -> dict[str, list[dict[str, str]]]:
    """Each scenario's runs, as the environment of each: the last one runs to the end."""
    return {
        "reference": [{}],
        "before_first_persist": [{"BURST_FAULT": "kill@2:1"}, {}],
        "mid_accumulation": [{"BURST_FAULT": "kill@5:1"}, {}],
        "during_persist": [{"BURST_KILLPOINT": killpoint}, {}],
        "near_end": [{"BURST_FAULT": f"kill@{script.last_step}:{script.last_micro}"}, {}],
        "twice_in_a_row": [{"BURST_FAULT": "kill@5:0"}, {"BURST_FAULT": "kill@10:1"}, {}],
    }


OLD_WAY = {"old_way": [{}], "old_way_resumed": [{"BURST_FAULT": "kill@5:1"}, {}]}


def load(script: Script):
    spec = importlib.util.spec_from_file_location(script.file[:-3], SCRIPTS / script.file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(main, argv: list[str], env: dict[str, str], err: Path) -> int:
    """``main(argv)`` in a forked child with ``env`` added; its exit code (-9: SIGKILL)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ.update(env)
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            main(argv)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def killpoint_of_second_persist(main, argv: list[str], work: Path) -> str:
    """The kill point just after the second persist's first blob began (its temporary
    written, not renamed), found on an unkilled run that logs every point. It counts blobs
    only, and the point after is the same thread's: the run's other writers (its inputs
    staged in the background, its events) reach points at times no two runs share."""
    log = work / "points.log"
    code = run_child(main, [*argv, "--run-id", "count-points", "--store", str(work / "count")],
                     {"BURST_KILLPOINT_LOG": str(log)}, work / "count.err")
    if code != 0:
        raise SystemExit(f"the unkilled run failed: {(work / 'count.err').read_text()[-2000:]}")
    names = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    second = [i for i, name in enumerate(names) if name == PERSIST_START][1]
    blob = names.index(PERSIST_POINT, second)
    nth = names[:blob + 1].count(PERSIST_POINT)
    return f"{PERSIST_POINT}#{nth}+1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", choices=sorted(SCRIPTS_UNDER_TEST), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # imports torch._dynamo (1-2 s)
    # once here, not in every child; it starts no thread
    script = SCRIPTS_UNDER_TEST[args.script]
    module = load(script)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"  # outside the source tree, as a user's data is
    module.main(["--data", str(data), "--write-data", str(script.data_size)])
    base = ["--data", str(data)]
    plan = scenarios(script, killpoint_of_second_persist(module.main, base, work))
    if args.script == "nanogpt":
        plan.update(OLD_WAY)
    results = {}
    for name, runs in plan.items():
        folder = work / name
        folder.mkdir()
        argv = [*base, "--run-id", name, "--store", str(folder / "store"),
                "--records", str(folder / "records.jsonl"), "--final", str(folder / "final.pt")]
        if name.startswith("old_way"):
            argv += ["--prefetch", "old"]
        exits, temporaries = [], []
        for i, env in enumerate(runs):
            exits.append(run_child(module.main, argv, env, folder / f"run{i}.err"))
            temporaries.append(sorted(str(p.relative_to(folder))
                                      for p in (folder / "store").rglob(".*.tmp")))
        results[name] = {"exits": exits, "temporaries": temporaries}
    args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()

"""The crash matrix's worker: one process that forks a child per kill point.

Run as ``python -m tests.helpers.crash_harness --endpoint URL --work DIR --shard 0/2 --out F``.
The parent imports torch, boto3 and burst once and starts no thread, then for each kill
point forks a child that arms :mod:`burst.killpoints` and runs the workload until it
SIGKILLs itself; another forked child then checks what the crash left. Forking keeps a
point at tens of milliseconds instead of the seconds a fresh interpreter would cost.

The workload is a run's whole storage life for two snapshots: persist to the local
tier (blobs, then the manifest), retention on the local tier, push to S3 (marker, blobs
with a multipart one, the manifest, marker removal), retention on S3. After each kill
the checker asserts: each store lists only snapshots that verify, nothing reported as
committed before the kill is gone, ``burst.Run`` resumes the newest listed snapshot with
the right values (from the local tier, and from S3 into an empty local tier), and a
restarted uploader plus GC bring both stores back to a clean, verifying state.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("BURST_FREEZE", "0")  # the environment freeze is not under test here

import torch

from burst import killpoints
from burst.snapshot import reader, retention, sync
from burst.snapshot import tiers as snapshot
from burst.state import capture as state
from burst.store import LocalStore
from burst.store.s3 import S3Store, make_client

RUN = "crash-run"
STEPS = (1, 2)
KEEP = 1  # so the second snapshot's GC drops the first
TAG = os.urandom(4).hex()  # this worker's corner of the bucket
GLOBAL_BATCH = 4
FROZEN = 1536 * 1024  # 6 MiB of float32: a multipart upload at the 5 MiB part size
WIDE = 384 * 1024  # 1.5 MiB: a blob of its own, new at every step


class Net(torch.nn.Module):
    """A frozen block (shared by every snapshot), a changing one, and packed small ones."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Parameter(torch.zeros(FROZEN), requires_grad=False)
        self.wide = torch.nn.Parameter(torch.zeros(WIDE))
        self.bias = torch.nn.Parameter(torch.zeros(16))

    def set_step(self, step: int) -> None:
        with torch.no_grad():
            self.frozen.copy_(torch.arange(FROZEN, dtype=torch.float32))
            self.wide.fill_(float(step))
            self.bias.fill_(float(step) / 2)

    def step_of(self) -> int:
        """The step whose values the model holds; raises if they are mixed or corrupt."""
        step = int(self.wide[0].item())
        expected = Net()
        expected.set_step(step)
        for name, tensor in expected.state_dict().items():
            if not torch.equal(tensor, self.state_dict()[name]):
                raise AssertionError(f"restored {name} does not hold step {step}'s values")
        return step


def captured(step: int) -> snapshot.Captured:
    model = Net()
    model.set_step(step)
    tree, live = state.capture(state.Components(model), {"note": step})
    meta = {"reason": "periodic", "time": "2025-01-01T00:00:00+00:00",
            "counters": {"step": step, "epoch": 0, "samples_consumed": step * GLOBAL_BATCH,
                         "samples_in_epoch": step * GLOBAL_BATCH, "total_steps": None},
            "batch": {"global": GLOBAL_BATCH, "micro": GLOBAL_BATCH, "accumulation": 1,
                      "world_size": 1},
            "amp": {"dtype": None}, "sampler": None}
    return snapshot.Captured(step, tree, {k: v.clone() for k, v in live.items()}, meta)


def stores(work: Path, client: object, index: int) -> tuple[LocalStore, S3Store]:
    local = LocalStore(work / f"p{index}" / "local")
    remote = S3Store("burst", f"crash/{TAG}/p{index}/", client, part_size=5 << 20, workers=4)
    return local, remote


def workload(local: LocalStore, remote: S3Store, progress: Path) -> None:
    """Two snapshots through both tiers; ``progress`` records what returned successfully."""
    for step in STEPS:
        snapshot.write_snapshot(local, RUN, captured(step))
        _note(progress, f"local {step}")
        snapshot.prune(local, RUN, keep=KEEP)
        sync.push_snapshot(local, remote, RUN, step, policy=sync.DEFAULT_RETRY)
        _note(progress, f"remote {step}")
        retention.gc(remote, RUN, keep_last=KEEP)


def _note(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def check(work: Path, local: LocalStore, remote: S3Store, progress: Path) -> dict:
    """What a kill left: only verifying snapshots, nothing committed lost, exact resume."""
    done = progress.read_text().split() if progress.exists() else []
    committed = {tier: max([int(done[i + 1]) for i in range(0, len(done), 2)
                            if done[i] == tier], default=0) for tier in ("local", "remote")}
    result: dict = {}
    for tier, store in (("local", local), ("remote", remote)):
        steps = reader.list_steps(store, RUN)
        for step in steps:
            reader.verify(store, RUN, step)
        if max(steps, default=0) < committed[tier]:
            raise AssertionError(f"{tier} lost step {committed[tier]}: it lists {steps}")
        result[f"{tier}_steps"] = steps
    for tier, store, fresh in (("local", local, "resume-a"), ("remote", remote, "resume-b")):
        resumed = result[f"resumed_{tier}"] = resume(store, work / fresh)
        # A request the killed process had already sent may still land on the server
        # after the first listing (a manifest PUT in flight): resume must give the newest
        # snapshot listed before it started, or one that completed since and verifies.
        newest_before = max(result[f"{tier}_steps"], default=None)
        landed_since = [s for s in reader.list_steps(store, RUN)
                        if newest_before is None or s > newest_before]
        for step in landed_since:
            reader.verify(store, RUN, step)
        if resumed != newest_before and resumed not in landed_since:
            raise AssertionError(f"resume from {tier} gave step {resumed}, the newest "
                                 f"complete snapshot is {newest_before}")
    recover(local, remote)
    return result


def resume(store: LocalStore | S3Store, fresh_local: Path) -> int | None:
    """What ``burst.Run`` restores: a remote store is pulled into an empty local tier."""
    import burst

    run = burst.Run(RUN, store=store, local=str(fresh_local), global_batch=GLOBAL_BATCH)
    model = Net()
    report = run.attach(model)
    return None if report is None else model.step_of()


def recover(local: LocalStore, remote: S3Store) -> None:
    """A restarted process: finish uploading, collect garbage; everything must verify."""
    steps = reader.list_steps(local, RUN)
    if steps:
        sync.push(local, remote, RUN, every=True)
    for store in (local, remote):
        retention.gc(store, RUN, keep_last=KEEP)
        for step in reader.list_steps(store, RUN):
            reader.verify(store, RUN, step)
    if steps and reader.list_steps(remote, RUN)[-1] != steps[-1]:
        raise AssertionError("the restarted upload did not bring the newest snapshot over")


def count_points(work: Path, client: object) -> list[str]:
    """Run the workload once, unkilled, logging every point: the matrix's coordinates."""
    log = work / "points.log"
    pid = os.fork()
    if pid == 0:
        _child(lambda: (killpoints.arm(None, str(log)),
                        workload(*stores(work, client, 0), work / "p0.progress")))
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("the unkilled workload failed")
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def _child(fn, errors: Path | None = None) -> None:
    """Run ``fn`` in a forked child and leave without running the parent's cleanup."""
    code = 0
    try:
        fn()
    except BaseException:
        traceback.print_exc()
        if errors is not None:
            errors.write_text(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def one_point(work: Path, client: object, index: int, target: int | None,
              delay: float | None) -> dict:
    """Kill the workload at point ``target`` (or after ``delay`` seconds), then check."""
    local, remote = stores(work, client, index)
    progress, log = work / f"p{index}.progress", work / f"p{index}.points"
    pid = os.fork()
    if pid == 0:
        _child(lambda: (killpoints.arm(target, str(log)), workload(local, remote, progress)))
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    names = log.read_text().splitlines() if log.exists() else []
    where = names[-1].split(" ", 1)[1] if names else "before the first point"
    outcome = {"index": index, "target": target, "delay": delay, "killed": killed,
               "at": where, "exit": os.waitstatus_to_exitcode(status)}
    out = work / f"p{index}.check.json"
    pid = os.fork()
    if pid == 0:
        _child(lambda: out.write_text(json.dumps(check(work / f"p{index}", local, remote,
                                                       progress))), work / f"p{index}.error")
    _, status = os.waitpid(pid, 0)
    outcome["ok"] = os.waitstatus_to_exitcode(status) == 0 and out.exists()
    if outcome["ok"]:
        outcome.update(json.loads(out.read_text()))
    elif (work / f"p{index}.error").exists():
        outcome["error"] = (work / f"p{index}.error").read_text()[-1500:]
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ca-bundle", default=None)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shard", default="0/1", help="I/N: this worker's share of points")
    parser.add_argument("--timed", type=int, default=0, help="extra kills at random times")
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = make_client({"endpoint_url": args.endpoint, "addressing_style": "path",
                          "region": "us-east-1", "ca_bundle": args.ca_bundle})
    args.work.mkdir(parents=True, exist_ok=True)
    points = count_points(args.work, client)
    shard, shards = map(int, args.shard.split("/"))
    outcomes = []
    for target in range(1 + shard, len(points) + 1, shards):
        outcomes.append(one_point(args.work, client, target, target, None))
    base = len(points) + 1
    for n in range(args.timed):  # kills from outside, at times no point marks
        delay = 0.05 + 0.11 * n
        outcomes.append(one_point(args.work, client, base + shard * 1000 + n, None, delay))
    args.out.write_text(json.dumps({"points": points, "outcomes": outcomes}))


if __name__ == "__main__":
    main()

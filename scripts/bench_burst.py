"""Time from a GPU failure to the first optimizer step on the node, without and with
pre-staging, over a 30 Mbit/s uplink.

A project trains with burst against an S3 server on loopback (moto, in its own process)
reached through a token-bucket TCP proxy that shapes what goes *up* (client to server) to
``--rate-mbit``, while downloads pass at loopback speed: the laptop's uplink is slow, the
node's pull from its region's store is not. The run reads a data set outside its project
(``--scale`` x 1 GB, declared as an input). It is SIGKILLed, and ``burst resume --to
local`` runs it on in a sealed stub node that has nothing but the store; the node's
training script writes the wall time of its first optimizer step. Two cases:

- ``cold``: no pre-staging (``BURST_STAGE=0``, and ``BURST_WHEELS=none`` while it trains
  so the freeze sends no wheel either), the run killed as soon as its first snapshot is in
  the store; the wheelhouse and whatever of the data the freeze had not sent go up at
  failure time (``burst resume`` builds the wheelhouse with the default policy).
- ``prestaged``: the run trains until its stager reports nothing left to upload
  (``<run>/readiness.json``), then is killed.

The node's wheelhouse is the real one of this venv (CPU torch, repacked, installed for
real). A CUDA wheelhouse is bigger (torch 2.5.1+cu124 with its nvidia-* pins and triton,
about 3.0 GB): those wheels are made of random bytes at their real sizes (x ``--scale``)
and their transfer is measured separately, the same way for both cases: at failure time
they go up through the shaped uplink unless they were pre-staged (a stager in this process
stages them while the run trains, at the run's rate), and the node's download of them is
timed from the store. Random-byte wheels cannot stand in for torch in an install, so their
install time is not measured; the node's set-up estimate (burst.env.readiness) adds it.

    .venv/bin/python scripts/bench_burst.py --scale 0.1      # a quick run (~10 minutes)
    .venv/bin/python scripts/bench_burst.py                  # 1 GB data, full CUDA wheels

Needs root (the sealed node). Prints one table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from burst.env import readiness, stageparts, throttle, wheelhouse  # noqa: E402
from burst.env.stager import Stager  # noqa: E402
from burst.store import open_store  # noqa: E402
from tests.helpers.sealed_project import environment  # noqa: E402
from tests.helpers.staging_helpers import house_of, small_lock, synthetic_wheel  # noqa: E402
from tests.helpers.store_servers import ACCESS_KEY, BUCKET, SECRET_KEY, free_port  # noqa: E402

PY = sys.executable
# torch 2.5.1+cu124 for CPython 3.11 on x86_64 and what it pins (PyPI sizes, MB)
CUDA_WHEELS = {"torch": 906, "nvidia-cudnn-cu12": 664, "nvidia-cublas-cu12": 363,
               "nvidia-cusparse-cu12": 207, "nvidia-cufft-cu12": 211, "nvidia-nccl-cu12": 188,
               "triton": 209, "nvidia-cusolver-cu12": 128, "nvidia-curand-cu12": 56,
               "nvidia-cuda-nvrtc-cu12": 25, "nvidia-nvjitlink-cu12": 21,
               "nvidia-cuda-cupti-cu12": 14, "nvidia-cuda-runtime-cu12": 1,
               "nvidia-nvtx-cu12": 1}
TARGET = wheelhouse.Target("3.11", policy="all")
DATA = "~/data/tokens.bin"

TRAIN = '''\
"""A run that reads its data set (outside the project) every step."""
import argparse, json, os, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import burst

p = argparse.ArgumentParser()
p.add_argument("--run-id"); p.add_argument("--store"); p.add_argument("--data")
p.add_argument("--steps-after-resume", type=int, default=0)
p.add_argument("--step-sleep", type=float, default=0.05)
args = p.parse_args()
run = burst.Run(args.run_id, store=args.store, global_batch=8, micro_batch=8,
                inputs=[args.data])  # persist interval: burst's own choice
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 8))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
restored = run.attach(model, optimizer)
path = burst.input_path(args.data)
size = os.path.getsize(path)
rows = max(size // 4096 - 1, 1)
data = TensorDataset(torch.arange(min(rows, 100_000)))
sampler = burst.ResumableSampler(data, seed=3)
loader = DataLoader(data, batch_size=run.micro_batch, sampler=sampler)
first = None
with open(path, "rb") as tokens:
    for epoch in run.epochs(1_000_000):
        for step in run.steps(loader):
            for (index,) in step:
                batch = []
                for i in index.tolist():
                    tokens.seek(i * 4096)
                    batch.append(torch.frombuffer(bytearray(tokens.read(1024)),
                                                  dtype=torch.uint8).float() / 255)
                loss = model(torch.stack(batch)).square().mean() * step.weight(len(index))
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if first is None and restored is not None:  # the node's first step
                first = time.time()
                with open("first_step.json", "w") as out:
                    json.dump({"time": first, "step": run.step,
                               "resumed": restored is not None}, out)
            time.sleep(args.step_sleep)
            if (restored is not None and args.steps_after_resume
                    and run.step >= restored.step + args.steps_after_resume):
                break
        else:
            continue
        break
run.close()
'''


# -- the shaped uplink -----------------------------------------------------------------


class Bucket:
    """A token bucket shared by every connection: the uplink is one link."""

    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.last = rate, 0.0, time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:  # one sender at a time, like packets on one link
            while True:
                now = time.monotonic()
                self.tokens = min(self.tokens + (now - self.last) * self.rate, self.rate * 0.05
                                  + n)
                self.last = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                time.sleep((n - self.tokens) / self.rate)


class ShapedProxy:
    """TCP on 127.0.0.1: client-to-server bytes at ``rate`` bytes/s, the other way free."""

    def __init__(self, upstream_port: int, rate: float) -> None:
        self.upstream, self.bucket = upstream_port, Bucket(rate)
        self.up_bytes = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, shaped: bool) -> None:
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                if shaped:
                    self.bucket.take(len(data))
                    self.up_bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


# -- the world ----------------------------------------------------------------------------


def start_moto(log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    server = subprocess.Popen([str(Path(PY).parent / "moto_server"), "-H", "127.0.0.1", "-p",
                               str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                          region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY)
    for _ in range(200):
        try:
            client.create_bucket(Bucket=BUCKET)
            return server, port
        except Exception:
            time.sleep(0.1)
    raise SystemExit("moto did not start")


def write_random(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        left = size
        while left > 0:
            chunk = os.urandom(min(left, 8 << 20))
            out.write(chunk)
            left -= len(chunk)


def cuda_wheels(directory: Path, scale: float) -> wheelhouse.Wheelhouse:
    paths = [synthetic_wheel(directory, name, max(int(mb * 1e6 * scale), 1000))
             for name, mb in CUDA_WHEELS.items()]
    return house_of(paths, TARGET)


def cuda_parts(house: wheelhouse.Wheelhouse, run_id: str) -> list:
    lock = small_lock(*CUDA_WHEELS)
    context = stageparts.Context(run_id, lambda: lock, ROOT, target=TARGET,
                                 build=lambda _l, _t: house)
    return stageparts.wheel_parts(context)


def store_for(url: str, endpoint: str):
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1"})
    return open_store(url, endpoint_url=endpoint, addressing_style="path")


def wait(what: str, check, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the training process ended ({process.returncode}) before {what}")
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


# -- one case -----------------------------------------------------------------------------


def run_case(case: str, args: argparse.Namespace, work: Path, proxy: ShapedProxy,
             house: wheelhouse.Wheelhouse, wheel_cache: Path) -> dict:
    base = work / case
    project, nodes = base / "project", base / "nodes"
    project.mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    data = base / "home" / "data" / "tokens.bin"
    write_random(data, int(1e9 * args.scale))
    endpoint = f"http://127.0.0.1:{proxy.port}"
    env = environment(endpoint, nodes, wheel_cache)
    env["HOME"] = str(base / "home")  # the data set is ~/data/tokens.bin, as users keep it
    env["BURST_STAGE"] = "0" if case == "cold" else "1"
    trainer_env = {**env, "BURST_LOCAL": str(project / ".burst")}
    if case == "cold":  # nothing ahead of time: not even the freeze's wheelhouse
        trainer_env["BURST_WHEELS"] = "none"
    env["BURST_STAGE_RATE"] = args.stage_rate
    run_id = f"bench-{case}"
    url = f"s3://{BUCKET}/{case}-{uuid.uuid4().hex[:6]}"
    store = store_for(url, endpoint)
    train = [PY, "train.py", "--run-id", run_id, "--store", url, "--data", DATA]
    log = (base / "train.log").open("w")
    started = time.monotonic()
    trainer = subprocess.Popen(train, cwd=project, stdout=log, stderr=subprocess.STDOUT,
                               env=trainer_env)
    tier = open_store(str(project / ".burst"))
    snapshotted = lambda: bool(store.list(f"{run_id}/snapshots/"))  # noqa: E731
    stager = None
    if case == "prestaged":  # the CUDA wheels, as the run's stager would send them
        fixed, share = throttle.parse_rate(args.stage_rate)
        rate = fixed or (share or 0.5) * args.rate_mbit * 125e3
        stager = Stager(store, run_id, cuda_parts(house, run_id), poll=1.0,
                        bucket=throttle.TokenBucket(lambda: rate / 2, paused=lambda: False))
        stager.start()

        def ready() -> bool:
            mine = readiness.load(tier, run_id)
            return (snapshotted() and mine is not None and mine.ready and stager.last is not None
                    and stager.last.ready)

        wait("pre-staging", ready, trainer, args.timeout)
    else:
        wait("the first snapshot in the store", snapshotted, trainer, args.timeout)
    trained = time.monotonic() - started
    trainer.send_signal(signal.SIGKILL)
    failed_at = time.time()
    trainer.wait()
    if stager is not None:
        stager.stop()
    up_before = proxy.up_bytes
    cuda_pending = [p.pending(store) for p in cuda_parts(house, run_id)]
    pending_cuda = house.bytes if any(p.objects and not p.bytes for p in cuda_pending) \
        else sum(p.bytes for p in cuda_pending)  # "not built yet": all of it
    cuda_up = 0.0
    if pending_cuda:  # what a burst of a CUDA run sends before it can launch
        began = time.monotonic()
        Stager(store, run_id, cuda_parts(house, run_id),
               bucket=throttle.TokenBucket(lambda: 1e12, paused=lambda: False)).run_once()
        cuda_up = time.monotonic() - began
    resume = subprocess.run(
        [PY, "-m", "burst.cli", "resume", run_id, "--to", "local", "--store", url, "--local",
         str(project / ".burst"), "--", "python", "train.py", "--run-id", run_id, "--store",
         url, "--data", DATA, "--steps-after-resume", "3"],
        cwd=project, capture_output=True, text=True, timeout=args.timeout, env=env)
    (base / "resume.log").write_text(resume.stdout + resume.stderr)
    firsts = list(nodes.glob("*/node0/home/burst-node/code/first_step.json"))
    if resume.returncode != 0 or not firsts:
        raise SystemExit(f"{case}: the resume failed ({resume.returncode}); see "
                         f"{base / 'resume.log'}:\n{(resume.stderr or '')[-3000:]}")
    first = json.loads(firsts[0].read_text())
    setup = [line for line in resume.stderr.splitlines() if "stub: setup on" in line]
    return {"case": case, "trained_seconds": round(trained, 1),
            "failure_to_first_step_seconds": round(first["time"] - failed_at, 1),
            "cuda_wheels_up_at_failure_seconds": round(cuda_up, 1),
            "cuda_wheel_bytes_pending_at_failure": pending_cuda,
            "uploaded_after_failure_bytes": proxy.up_bytes - up_before,
            "node_setup": setup[-1].strip() if setup else None,
            "resumed_step": first["step"]}


def download_seconds(house: wheelhouse.Wheelhouse, endpoint: str, url: str) -> float:
    """The node's pull of the CUDA wheels from the store (the unshaped direction)."""
    store = store_for(url, endpoint)
    for wheel in house.wheels:
        if wheel.path is not None:
            store.put_file(wheel.key, wheel.path)
    began = time.monotonic()
    for wheel in house.wheels:
        store.get(wheel.key)
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="data set = SCALE x 1 GB, CUDA wheels = SCALE x their sizes")
    parser.add_argument("--rate-mbit", type=float, default=30.0, help="the uplink")
    parser.add_argument("--stage-rate", default="90%",
                        help="$BURST_STAGE_RATE for the pre-staged run")
    parser.add_argument("--cases", default="cold,prestaged")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--wheel-cache", default=str(Path(tempfile.gettempdir())
                                                     / "bench-burst-wheels"),
                        help="repacked wheels of this venv, kept between runs")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the sealed stub node needs root")
    work = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    server, port = start_moto(work / "moto.log")
    try:
        proxy = ShapedProxy(port, args.rate_mbit * 125e3)
        house = cuda_wheels(work / "cuda-wheels", args.scale)
        results = [run_case(case, args, work, proxy, house, Path(args.wheel_cache))
                   for case in args.cases.split(",")]
        down = download_seconds(house, f"http://127.0.0.1:{port}",
                                 f"s3://{BUCKET}/download-{uuid.uuid4().hex[:6]}")
    finally:
        server.terminate()
        server.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(args, results, down, house)


def report(args: argparse.Namespace, results: list[dict], down: float,
           house: wheelhouse.Wheelhouse) -> None:
    print(f"uplink {args.rate_mbit:g} Mbit/s, data {args.scale:g} GB, CUDA wheels "
          f"{house.bytes / 1e9:.2f} GB (synthetic; their node download {down:.1f} s, "
          "install not measured)")
    print(f"{'case':<10} {'trained s':>9} {'failure->first step s':>22} {'CUDA up s':>10} "
          f"{'sent after failure MB':>22}  node set-up")
    for r in results:
        print(f"{r['case']:<10} {r['trained_seconds']:>9} "
              f"{r['failure_to_first_step_seconds'] + down:>22.1f} "
              f"{r['cuda_wheels_up_at_failure_seconds']:>10} "
              f"{r['uploaded_after_failure_bytes'] / 1e6:>22.1f}  {r['node_setup']}")
    print("failure->first step = measured (sealed node, real CPU wheelhouse, data, snapshot; "
          "CUDA wheels' upload at failure included) + the CUDA wheels' node download")
    if args.json:
        Path(args.json).write_text(json.dumps({"scale": args.scale, "rate_mbit": args.rate_mbit,
                                               "cuda_download_seconds": down,
                                               "cuda_wheel_bytes": house.bytes,
                                               "cases": results}, indent=1))


if __name__ == "__main__":
    main()

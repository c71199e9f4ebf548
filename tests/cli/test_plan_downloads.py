"""``burst plan`` says what the node will download: each thing, from where (the store or
a mirror), how many bytes, what the store still lacks, and how long it takes at the
speeds burst measured (a node's snapshot pull, the run's snapshot uploads), or that the
time is unmeasured."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.env import codearchive, lockfile, readiness
from burst.env import wheelhouse as wheels
from burst.env.lockfile import Package
from burst.inputs import chunks
from burst.plan import cards as gpus
from burst.resume.node import PULL_EVENT
from burst.store import open_store
from tests.helpers.env_helpers import tiny_lockfile
from tests.helpers.plan_helpers import GIB, manifest, put_manifest

MB = 10**6
LOCK = tiny_lockfile(Package("numpy", "2.1.0"), Package("torch", "2.5.1"))
WHEELS = [("numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl", 16 * MB),
          ("burst_failover-0.1.0-py3-none-any.whl", 2 * MB)]
CODE = b"x" * 300_000
INPUT = 10 * 2**20  # one 10 MiB input file: two chunks, the second not in the store


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    def refuse(*_args, **_kwargs):
        raise AssertionError("burst plan asked SkyPilot's catalog in a test")
    monkeypatch.setattr(gpus, "skypilot_offerings", refuse)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "no-config.toml"))


@pytest.fixture
def run(tmp_path) -> dict:
    """A run whose store holds a snapshot, code, a lockfile with its wheelhouse (numpy
    there, burst's wheel not yet; torch left to a mirror) and an input half uploaded."""
    store, local = open_store(str(tmp_path / "store")), open_store(str(tmp_path / "local"))
    snap = manifest("run", n_params=1000, peaks={8: 3 * GIB, 16: 5 * GIB}, global_batch=64,
                    micro=8, card="NVIDIA L4", reason="oom")
    put_manifest(store, snap)
    store.put(codearchive.archive_key("run", sha("code")), CODE)
    store.put(codearchive.latest_key("run"), json.dumps({"archive": sha("code")}).encode())
    lockfile.save(store, "run", LOCK)
    listed = [{"name": f.split("-")[0], "version": f.split("-")[1], "file": f,
               "sha256": sha(f), "size": size, "role": "dependency"} for f, size in WHEELS]
    store.put(wheels.index_key("run", LOCK.digest), json.dumps({
        "format": wheels.FORMAT, "target": {"policy": "no-torch"}, "wheels": listed,
        "missing": [{"name": "torch", "version": "2.5.1", "why": "policy no-torch"}]}).encode())
    store.put(wheels.wheel_key(sha(WHEELS[0][0]), WHEELS[0][0]), b"w")
    first, second = sha("chunk 1"), sha("chunk 2")
    chunks.save(store, "run", chunks.Manifest(files=[chunks.FileEntry(
        "/home/me/data/tokens.bin", INPUT, 0o644, 0, sha("file"), (first, second))]))
    store.put(chunks.chunk_key(first), b"c")
    blobs = sum(info["size"] for info in snap["blobs"].values())
    return {"store": store, "local": local, "url": store.url, "local_url": local.url,
            "snapshot": blobs}


def plan(run: dict, *args: str):
    return CliRunner().invoke(main, ["plan", "run", "--store", run["url"], "--local",
                                     run["local_url"], "--offline", "--gpu", "A100", *args],
                              catch_exceptions=False)


def downloads(run: dict) -> dict:
    result = plan(run, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["downloads"]


def item(data: dict, prefix: str) -> dict:
    return next(i for i in data["items"] if i["what"].startswith(prefix))


def test_each_thing_the_node_fetches_is_listed_with_its_bytes(run):
    data = downloads(run)
    assert item(data, "snapshot step 100")["bytes"] == run["snapshot"]
    assert item(data, "code archive")["bytes"] == len(CODE)
    assert item(data, "wheelhouse (2 wheels)")["bytes"] == 18 * MB
    assert item(data, "inputs (1 files)")["bytes"] == INPUT


def test_what_the_policy_leaves_out_comes_from_a_mirror(run):
    torch = item(downloads(run), "torch 2.5.1")
    assert torch["source"] == "mirror" and torch["bytes"] is None


def test_what_the_store_lacks_is_counted_as_uploaded_first(run):
    data = downloads(run)
    assert item(data, "wheelhouse")["missing"] == 2 * MB  # burst's wheel is not there yet
    assert item(data, "inputs")["missing"] == INPUT - chunks.CHUNK_BYTES
    assert data["to_upload_bytes"] == 2 * MB + INPUT - chunks.CHUNK_BYTES


def test_the_download_is_timed_at_the_speed_a_node_measured(run):
    events.record(run["store"], "run", PULL_EVENT, say=lambda _m: None, bytes=200 * MB,
                  seconds=2.0)
    data = downloads(run)
    assert data["downlink"]["rate"] == 100 * MB
    assert data["download_seconds"] == pytest.approx(data["from_store_bytes"] / (100 * MB))


def test_a_pull_too_small_to_time_bandwidth_is_no_measurement(run):
    events.record(run["store"], "run", PULL_EVENT, say=lambda _m: None, bytes=4096,
                  seconds=0.01)
    data = downloads(run)
    assert data["downlink"] == {"rate": None, "by": "unmeasured"}
    assert data["download_seconds"] is None


def test_the_upload_is_timed_at_the_runs_measured_uplink(run):
    readiness.save(run["local"], "run", readiness.Readiness(0, 0, 0.0, 0.0, 3.75 * MB))
    data = downloads(run)
    assert data["upload_seconds"] == pytest.approx(data["to_upload_bytes"] / (3.75 * MB))


def test_the_text_names_sources_sizes_and_unmeasured_times(run):
    result = plan(run)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "the node downloads:" in text
    assert "torch 2.5.1: size unknown from the mirror" in text
    assert "not in the store yet" in text
    assert "time unmeasured" in text


def test_the_text_gives_a_time_at_a_measured_speed(run):
    events.record(run["store"], "run", PULL_EVENT, say=lambda _m: None, bytes=200 * MB,
                  seconds=2.0)
    assert "at 800.0 Mbit/s (a node's snapshot pull" in plan(run).output


def test_without_a_wheelhouse_the_plan_says_it_is_built_at_resume_and_which(run, monkeypatch):
    monkeypatch.delenv(wheels.POLICY_ENV, raising=False)
    run["store"].delete(wheels.index_key("run", LOCK.digest))
    wheelhouse = item(downloads(run), "wheelhouse")
    assert wheelhouse["bytes"] is None and "built and uploaded at resume" in wheelhouse["note"]
    assert "no-torch: public-cloud candidates only" in wheelhouse["note"]

"""A real CUDA OOM, in the forward pass and inside ``optimizer.step()``, under ``burst run``:
the run snapshots, the agent retries with a smaller micro-batch, and every step trains on the
samples of the run that never failed."""

from __future__ import annotations

import pytest

from burst import events
from burst.store import LocalStore
from tests.gpu.common import MARKS, records, train

pytestmark = MARKS


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gpu-reference")
    done = train(workdir, "ref")
    assert done.returncode == 0, done.stderr[-3000:]
    return records(workdir, "ref")


def history(workdir, run_id: str) -> list[dict]:
    return events.read(LocalStore(workdir / "store"), run_id)


@pytest.mark.parametrize("where", ["forward", "optimizer"])
def test_a_real_oom_snapshots_and_retries_smaller_with_the_same_samples(where, tmp_path,
                                                                         reference):
    done = train(tmp_path, "oom", "--oom", where, "--oom-step", "5",
                 "--oom-once", str(tmp_path / "fired"),
                 supervised=("--on-oom", "retry-smaller", "--max-retries", "2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "fired").exists()  # the OOM really happened in the first attempt
    story = history(tmp_path, "oom")
    failure = next(e for e in story if e["event"] == "failure")
    assert failure["kind"] == "oom"
    assert failure["in_optimizer_step"] is (where == "optimizer")
    resume = next(e for e in story if e["event"] == "resume")
    assert (resume["micro"], resume["accumulation"]) == (4, 4)
    got = records(tmp_path, "oom")
    assert [r["indices"] for r in got] == [r["indices"] for r in reference]
    assert len(got) == 12

"""What was chosen at push is what resume uses: ``burst push --wheels no-torch`` followed by
``burst resume`` uploads no torch wheel.

A real run (one snapshot, in its local tier) is pushed to a real S3 server on 127.0.0.1
(moto) with ``--wheels no-torch``; its lockfile pins a small dependency and a torch, both
wheels in a local find-links directory (pip reaches nothing else), so a wheelhouse built
with ``all`` would upload the torch wheel. ``burst resume --to local`` then prepares the
launch for real (the wheelhouse step included) and the stub refuses every candidate for
capacity, so nothing trains: the store's ``wheels/`` must be exactly what the push left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.env import lockfile, wheelchoice
from burst.env.lockfile import Package
from burst.store import open_store
from tests.helpers.env_helpers import build_wheel, tiny_lockfile
from tests.helpers.store_servers import aws_env, free_port

pytestmark = pytest.mark.e2e
TORCH = "2.5.1+cpu"
TRAIN = """\
import torch
import burst

run = burst.Run("run", store={store!r}, global_batch=4)
model = torch.nn.Linear(2, 1)
run.attach(model)
for step in run.batches(lambda: torch.ones(4, 2), steps=1):
    for x in step:
        model(x).sum().backward()
run.close()
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A run with one snapshot in its local tier; the wheel links and a wheel cache that
    the tests share (burst's own wheel is built once)."""
    root = tmp_path_factory.mktemp("wheel-choice")
    local, links = root / "local", root / "links"
    build_wheel(links, "burst-wc-dep", "1.0.0", "V = 1\n")
    build_wheel(links, "torch", TORCH, "V = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    done = subprocess.run([sys.executable, "-c", TRAIN.format(store=str(local))],
                          cwd=root, env={**env, "BURST_FREEZE": "0"}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"local": local, "links": links, "cache": root / "cache"}


@pytest.fixture(scope="module")
def environment(trained, moto_s3):
    """This machine as a user's with nothing chosen through the environment, whose pip
    reaches only the links directory."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        aws_env(monkeypatch)
        for name in [k for k in os.environ if k.startswith(("BURST_", "PIP_"))]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("BURST_CONFIG", os.devnull)
        monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
        monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
        monkeypatch.setenv("BURST_WHEEL_CACHE", str(trained["cache"]))
        monkeypatch.setenv("BURST_WHEELS_TORCH", "cpu")  # the build a CPU node runs
        monkeypatch.setenv("BURST_NODE_GPU", "cpu")
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
        monkeypatch.setenv("PIP_FIND_LINKS", str(trained["links"]))
        monkeypatch.setenv("PIP_RETRIES", "0")
        yield


def push(moto_s3, trained, name: str, policy: str) -> str:
    """The run, with its lockfile, pushed to a store of its own with ``--wheels policy``."""
    url = moto_s3.url(f"wheel-choice-{name}")
    lockfile.save(open_store(url), "run", tiny_lockfile(Package("burst-wc-dep", "1.0.0"),
                                                        Package("torch", TORCH)))
    result = CliRunner().invoke(main, ["push", "run", "--store", url, "--local",
                                       str(trained["local"]), "--wheels", policy])
    assert result.exit_code == 0, result.output
    return url


@pytest.fixture(scope="module")
def pushed(environment, moto_s3, trained) -> tuple[str, Path]:
    """The run pushed with ``--wheels no-torch``: (store url, local tier)."""
    return push(moto_s3, trained, "no-torch", "no-torch"), trained["local"]


def wheel_files(url: str) -> list[str]:
    return sorted(Path(key).name for key in open_store(url).list("wheels/"))


def resume(url: str, local: Path, tmp_path: Path, *args: str):
    return CliRunner().invoke(main, [
        "resume", "run", "--to", "local", "--offline", "--store", url, "--local", str(local),
        "--stub-root", str(tmp_path / "nodes"), "--stub-fail-first", "99", *args,
        "--", "python", "train.py"])


def test_push_with_no_torch_uploads_the_wheelhouse_without_torch(pushed):
    url, _ = pushed
    files = wheel_files(url)
    assert any(f.startswith("burst_wc_dep-") for f in files)
    assert not any(f.startswith("torch-") for f in files)


def test_push_records_the_choice_for_the_run(pushed):
    url, _ = pushed
    assert wheelchoice.recorded(open_store(url), "run").policy == "no-torch"


def test_resume_after_push_with_no_torch_uploads_no_torch_wheel(pushed, tmp_path):
    url, local = pushed
    before = wheel_files(url)
    result = resume(url, local, tmp_path)
    assert "wheelhouse: no-torch: chosen at freeze/push" in result.output, result.output
    assert wheel_files(url) == before  # nothing built or uploaded again


def test_wheels_on_the_resume_command_line_override_the_recorded_choice(
        environment, moto_s3, trained, tmp_path):
    url = push(moto_s3, trained, "override", "none")  # recorded: no wheelhouse at all
    result = resume(url, trained["local"], tmp_path, "--wheels", "all")
    assert "wheelhouse: all: --wheels of this resume" in result.output, result.output
    assert f"torch-{TORCH}-py3-none-any.whl" in wheel_files(url)
    assert wheelchoice.recorded(open_store(url), "run").policy == "all"  # the next one too

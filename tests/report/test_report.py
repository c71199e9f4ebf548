"""``burst report`` for a run with a failure and a resume: the HTML parses, the charts are
valid PNGs of the documented size, and the page tells the run's story; ``run.log``
writes its metrics in batches, not one write per step."""

from __future__ import annotations

import contextlib
import json
import struct
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader, TensorDataset

import burst
from burst import events
from burst.cli import main
from burst.contract import ENV_FAULT
from burst.report.charts import HEIGHT, WIDTH
from burst.store import LocalStore

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def train(store: Path, expect_oom: bool) -> None:
    """Train in-process; ``expect_oom``: the ``BURST_FAULT`` drill set stops this one."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = burst.Run("story", store=store, global_batch=8, micro_batch=4, persist_every=2)
    run.attach(model, optimizer)
    loader = DataLoader(data, batch_size=run.micro_batch, sampler=burst.ResumableSampler(data))
    expected = pytest.raises(SystemExit) if expect_oom else contextlib.nullcontext()
    with expected, run:  # the run's guard turns the OOM into a snapshot and SystemExit(86)
        for _ in run.epochs(2):
            for step in run.steps(loader):
                for x, y in step:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    (loss * step.weight(len(x))).backward()
                optimizer.step()
                optimizer.zero_grad()
                run.log(loss=loss)


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def story(tmp_path, monkeypatch) -> Path:
    store = tmp_path / "store"
    # a real CUDA OOM in step 6, as a drill raises it on a CPU (which has no CUDA to run out)
    monkeypatch.setenv(ENV_FAULT, "oom@6")
    train(store, expect_oom=True)
    train(store, expect_oom=False)  # the drill fired once: resumes after it and finishes
    gib = 1024**3
    for used in (10, 20, 21):  # what the agent's NVML watch records on a GPU box
        events.append(LocalStore(store), "story", "gpu-sample", source="agent",
                      gpus=[{"index": 0, "memory_used": used * gib, "memory_total": 24 * gib}])
    events.append(LocalStore(store), "story", "memory-alert", threshold=0.8, gpu=0)
    return store


def test_report_renders_a_run_with_a_failure_and_a_resume(story, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", "story", "--store", str(story), "--out",
                                       str(out), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    summary = written["summary"]
    assert summary["failures"] == 1 and summary["resumes"] == 1
    assert summary["final step"] == 16 and summary["memory alerts"] == 1
    page = Tags()
    page.feed((out / "index.html").read_text())
    page.close()
    assert sorted(page.images) == ["loss.png", "memory.png", "throughput.png"]
    for name in page.images:
        assert png_size(out / name) == (WIDTH, HEIGHT)
    text = " ".join(page.text)
    assert "oom in step 6" in text and "resumed at step 5" in text
    assert "Where the run went" in text


def test_run_log_batches_metric_points_into_few_events(story):
    history = events.read(LocalStore(story), "story")
    batches = [e for e in history if e["event"] == "metrics"]
    points = [p for e in batches for p in e["points"]]
    assert len(batches) < len(points) / 1.5  # several points per write
    assert {p["step"] for p in points} == set(range(1, 17))
    assert all(isinstance(p["loss"], float) for p in points)


def test_report_help_has_an_example():
    result = CliRunner().invoke(main, ["report", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output


def test_the_resume_after_the_failure_is_a_membership_change_from_the_store(story):
    changes = [e for e in events.read(LocalStore(story), "story")
               if e["event"] == "membership-change"]
    assert len(changes) == 1
    change = changes[0]
    # the OOM in step 6 persisted the boundary after step 5: nothing trained was lost
    assert (change["step"], change["steps_lost"], change["state_from"], change["cause"]) \
        == (5, 0, "store", "oom")
    assert (change["world_before"], change["world_after"]) == (1, 1)
    failure = next(e for e in events.read(LocalStore(story), "story") if e["event"] == "failure")
    elapsed = (datetime.fromisoformat(change["time"])
               - datetime.fromisoformat(failure["time"])).total_seconds()
    # from the failure to the first optimizer step after the resume, which recorded it
    assert 0 < change["seconds_to_step"] <= elapsed + 0.001


def test_report_json_and_table_show_the_membership_change(story, tmp_path):
    out = tmp_path / "report"
    as_json = CliRunner().invoke(main, ["report", "story", "--store", str(story), "--out",
                                        str(out), "--json"])
    assert as_json.exit_code == 0, as_json.output
    written = json.loads(as_json.output)
    assert [(c["step"], c["state_from"], c["steps_lost"]) for c in written["membership"]] \
        == [(5, "store", 0)]
    assert written["summary"]["membership changes"] == 1
    table = CliRunner().invoke(main, ["report", "story", "--store", str(story), "--out",
                                      str(out)])
    assert table.exit_code == 0, table.output
    header, row = table.output.splitlines()[1:3]
    assert header.split()[:3] == ["step", "state", "from"]
    assert row.split()[:5] == ["5", "store", "1", "->", "1"] and row.split()[-1] == "oom"
    page = Tags()
    page.feed((out / "index.html").read_text())
    assert "Membership changes" in " ".join(page.text)

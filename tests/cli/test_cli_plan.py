"""``burst plan`` through click: table, JSON, flags, and one-line errors with exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.plan import cards as gpus
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """SkyPilot's catalog is never asked unless a test fakes it; no user config is read."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("burst plan asked SkyPilot's catalog in a test")
    monkeypatch.setattr(gpus, "skypilot_offerings", refuse)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.delenv("BURST_OFFLINE", raising=False)


@pytest.fixture
def store_url(tmp_path):
    url = str(tmp_path / "store")
    peaks = {8: 3 * GIB, 16: 5 * GIB}  # 1 GiB static part, 0.25 GiB per sample
    put_manifest(open_store(url), manifest("run", n_params=1000, peaks=peaks, global_batch=64,
                                           micro=8, card="NVIDIA L4", reason="oom"))
    return url


def plan(*args: str):
    return CliRunner().invoke(main, ["plan", *args], catch_exceptions=False)


def test_plan_prints_a_table_with_the_chosen_plan_first(store_url):
    result = plan("run", "--store", store_url, "--offline", "--gpu", "A100,L40S")
    assert result.exit_code == 0, result.output
    assert "plans for run" in result.output and "chosen:" in result.output
    assert "BURST_MICRO_BATCH=" in result.output


def test_plan_json_lists_candidates_in_order_with_the_chosen_one_first(store_url):
    result = plan("run", "--store", store_url, "--offline", "--json", "--gpu", "L4,A100,H100")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    chosen, first = data["chosen"], data["candidates"][0]
    assert chosen == first and chosen["fits"] and chosen["spot"]
    assert chosen["card"] == "A100"  # cheapest card bigger than the L4 that ran out of memory
    assert chosen["micro_batch"] * chosen["accumulation"] * chosen["world_size"] == 64
    assert chosen["env"]["BURST_AMP"] == "bf16"
    assert any(c["card"] == "L4" and not c["fits"] for c in data["candidates"])


def test_plan_counts_and_infra_flags_shape_the_candidates(store_url):
    result = plan("run", "--store", store_url, "--offline", "--json", "--gpu", "A100",
                  "--count", "1,2", "--infra", "k8s/lab", "--infra", "aws/us-east-1")
    data = json.loads(result.output)
    rows = [(c["count"], c["infra"], c["spot"]) for c in data["candidates"] if c["fits"]]
    assert rows[0] == (1, "k8s/lab", False)  # own capacity first (the default tier order)
    assert (1, "k8s/lab", True) not in rows and (1, "k8s/lab", False) in rows


def test_plan_reads_region_profiles_from_the_config(store_url, tmp_path):
    config = tmp_path / "burst.toml"
    config.write_text('[regions.beijing]\nkubernetes = ["bj"]\n')
    result = plan("run", "--store", store_url, "--offline", "--json", "--gpu", "A100",
                  "--region", "beijing", "--config", str(config), "--spot", "never")
    data = json.loads(result.output)
    assert data["chosen"]["infra"] == "k8s/bj"
    assert any("mainland China" in note for note in data["profile_notes"])


def test_plan_uses_skypilots_catalog_unless_offline(store_url, monkeypatch):
    class Offer:
        accelerator_count, device_memory, price, spot_price = 8, 80.0, 8.0, 4.0

    monkeypatch.setattr(gpus, "skypilot_offerings", lambda *a, **k: {"A100-80GB": [Offer()]})
    result = plan("run", "--store", store_url, "--json", "--gpu", "A100-80GB")
    data = json.loads(result.output)
    assert data["catalog"].startswith("embedded + SkyPilot")
    assert data["chosen"]["price_per_hour"] == pytest.approx(0.5)


def test_unknown_gpu_is_a_one_line_error_with_close_names(store_url):
    result = plan("run", "--store", store_url, "--offline", "--gpu", "A100-80")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "did you mean A100-80GB" in result.output
    assert "Traceback" not in result.output


def test_a_model_that_fits_nowhere_exits_non_zero_with_the_reason(store_url):
    result = plan("run", "--store", store_url, "--offline", "--gpu", "T4", "--margin", "0.1")
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: no candidate can take the run: fits nowhere on T4")


def test_an_unsplittable_gpu_count_exits_non_zero_naming_the_nearest_layouts(store_url):
    result = plan("run", "--store", store_url, "--offline", "--json", "--gpu", "A100",
                  "--count", "3")
    assert result.exit_code == 2
    assert "cannot be split evenly over 3 GPUs" in result.output
    assert "use 2 or 4 GPUs" in result.output


def test_a_run_without_a_snapshot_is_an_error(tmp_path):
    result = plan("nope", "--store", str(tmp_path / "empty"), "--offline")
    assert result.exit_code != 0 and "has no snapshot" in result.output


def test_plan_without_a_run_id_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("BURST_RUN_ID", raising=False)
    assert plan("--offline").exit_code == 2


def test_plan_says_how_the_node_gets_the_locks_python(store_url, monkeypatch):
    from burst.env import lockfile
    from burst.env.lockfile import Lockfile

    result = plan("run", "--store", store_url, "--offline", "--gpu", "A100")
    assert "node python: the run was never frozen" in result.output
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", "/nonexistent")  # no standalone here
    lockfile.save(open_store(store_url), "run", Lockfile([], python={"version": "3.12.3"}))
    result = plan("run", "--store", store_url, "--offline", "--gpu", "A100", "--json")
    way = json.loads(result.output)["node_python"]
    assert (way["way"], way["python"]) == ("uv", "3.12")

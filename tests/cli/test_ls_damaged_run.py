"""``burst ls`` and ``burst status`` over a store where one run is damaged: the others
list, the bad one is a row with its reason, and the exit code says the list is short."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from burst.cli import main
from burst.contract import Exit
from burst.snapshot import format as fmt
from burst.snapshot import lineage
from burst.store import LocalStore, open_store
from burst.store.base import Store
from tests.helpers.snapshot_helpers import take
from tests.helpers.store_servers import aws_env


def damaged_store(store: Store) -> None:
    """Three runs: ``good``; ``bad`` (its newest manifest is not JSON); ``noisy`` (its
    history and a lineage record are garbage, its manifests sound)."""
    for run_id in ("good", "bad", "noisy"):
        take(store, 10, run_id=run_id)
        take(store, 20, run_id=run_id)
    store.put(fmt.manifest_key("bad", 20), b"{ not a manifest")
    store.put("noisy/events.jsonl", b"\x00\xff garbage\n{\"half\":")
    store.put(lineage.key("noisy", 1), b"\xfe\xff")


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        url = str(tmp_path / "store")
    else:
        moto = request.getfixturevalue("moto_s3")
        aws_env(monkeypatch)
        monkeypatch.setenv("BURST_ENDPOINT_URL", moto.endpoint)
        monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
        url = moto.url()
    damaged_store(LocalStore(tmp_path / "store") if request.param == "local"
                  else open_store(url))
    return url


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_ls_lists_the_other_runs_and_names_the_bad_one_with_a_distinct_exit(store_url):
    result = invoke("ls", "--store", store_url)
    assert result.exit_code == Exit.RUNS_UNREADABLE, result.output
    assert "good" in result.stdout and "noisy" in result.stdout
    assert "unreadable" in result.stdout and "bad" in result.stdout
    assert "Traceback" not in result.output
    last = result.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("Error: 1 of 3 runs could not be read: bad (")


def test_ls_json_carries_each_runs_error(store_url):
    result = invoke("ls", "--store", store_url, "--json")
    assert result.exit_code == Exit.RUNS_UNREADABLE
    runs = {run["run"]: run for run in json.loads(result.stdout)}
    assert sorted(runs) == ["bad", "good", "noisy"]
    assert runs["good"]["error"] is None and runs["good"]["newest_step"] == 20
    assert runs["noisy"]["error"] is None and runs["noisy"]["newest_step"] == 20
    assert runs["bad"]["error"] and "bad@20" in runs["bad"]["error"]
    assert runs["bad"]["snapshots"] == 2


def test_status_of_the_whole_store_degrades_per_run_too(store_url):
    table = invoke("status", "--store", store_url)
    assert table.exit_code == Exit.RUNS_UNREADABLE
    assert "good" in table.stdout and "unreadable" in table.stdout
    listed = invoke("status", "--store", store_url, "--json")
    assert listed.exit_code == Exit.RUNS_UNREADABLE
    errors = {run["run"]: run["error"] for run in json.loads(listed.stdout)}
    assert errors["good"] is None and errors["noisy"] is None and errors["bad"]


def test_a_sound_store_still_lists_with_exit_0(tmp_path):
    store = LocalStore(tmp_path / "store")
    take(store, 10, run_id="good")
    result = invoke("ls", "--store", str(tmp_path / "store"), "--json")
    assert result.exit_code == 0
    assert [run["error"] for run in json.loads(result.stdout)] == [None]

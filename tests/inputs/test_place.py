"""Inputs on a node: placed from the store's verified chunks at the path the run read them
from when the node allows it, else under ``$BURST_NODE_DIR/inputs`` with a map that
``burst.input_path`` and one variable per input follow."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import burst
from burst.errors import SnapshotError
from burst.inputs import chunks, names, part, place
from burst.store import open_store


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))


def stage(store, *declared, run_id="run"):
    return part.InputsPart(run_id, declared, record=False, say=lambda _l: None).stage(store)


def node_view(node_dir: Path) -> dict[str, str]:
    return {**os.environ, **place.node_env(node_dir)}


def test_an_input_is_placed_at_the_same_path_with_its_bytes_mode_and_mtime(store, dataset,
                                                                           tmp_path):
    stage(store, dataset)
    original = {p: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
                for p in dataset.rglob("*") if p.is_file()}
    shutil.rmtree(dataset)  # the node has none of this machine's files
    place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    assert {p: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
            for p in original} == original
    env = node_view(tmp_path / "node")
    assert env["BURST_INPUT_DATA"] == str(dataset)
    assert burst.input_path(dataset / "tokens.bin", env) == str(dataset / "tokens.bin")


def test_where_the_node_forbids_the_path_the_input_is_placed_under_the_node_dir(
        store, dataset, tmp_path):
    stage(store, dataset)
    shutil.rmtree(dataset)
    dataset.parent.joinpath("blocked").write_text("")  # a file where a folder must go
    os.replace(dataset.parent / "blocked", dataset)
    node = tmp_path / "node"
    place.place(store, "run", node, say=lambda _l: None)
    placed = node / "inputs" / str(dataset).lstrip("/")
    env = node_view(node)
    assert env["BURST_INPUT_DATA"] == str(placed)
    assert burst.input_path(dataset / "docs" / "doc1.txt", env) == str(placed / "docs"
                                                                        / "doc1.txt")
    assert (placed / "docs" / "doc1.txt").read_text() == "document 1\n" * 100


def test_a_different_file_already_at_the_path_is_never_overwritten(store, dataset, tmp_path):
    stage(store, dataset)
    (dataset / "docs" / "doc0.txt").write_text("the node's own file")
    place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    assert (dataset / "docs" / "doc0.txt").read_text() == "the node's own file"
    assert node_view(tmp_path / "node")["BURST_INPUT_DATA"] != str(dataset)


def test_a_chunk_that_does_not_match_its_hash_is_refused_and_nothing_is_placed(store, dataset,
                                                                               tmp_path):
    manifest = stage(store, dataset)
    tokens = next(f for f in manifest.files if f.path.endswith("tokens.bin"))
    store.put(chunks.chunk_key(tokens.chunks[1]), b"tampered")
    shutil.rmtree(dataset)
    with pytest.raises(SnapshotError, match="does not match its hash"):
        place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    assert not (dataset / "tokens.bin").exists()
    assert not [p for p in dataset.rglob(".tokens.bin.*")]  # no half-written file left


def test_a_second_setup_fetches_nothing_again(store, dataset, tmp_path):
    stage(store, dataset)
    said: list[str] = []
    place.place(store, "run", tmp_path / "node", say=said.append)
    assert said[-1].startswith("inputs: 0.0 MB fetched") and "4 file(s) already here" in said[-1]


def test_a_hub_cache_is_placed_and_its_variable_points_at_the_copy(store, tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    (cache / "hub").mkdir(parents=True)
    (cache / "hub" / "weights.pt").write_bytes(b"weights")
    monkeypatch.setenv("HF_HOME", str(cache))
    inputs = part.InputsPart("run", record=True, say=lambda _l: None)
    (cache / "hub" / "weights.pt").read_bytes()
    inputs.stage(store)
    place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    assert node_view(tmp_path / "node")["HF_HOME"] == str(cache)


def test_a_url_input_is_the_url_on_the_node(store, tmp_path):
    stage(store, "s3://bucket/corpus")
    place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    env = node_view(tmp_path / "node")
    assert env["BURST_INPUT_CORPUS"] == "s3://bucket/corpus"
    assert burst.input_path("s3://bucket/corpus/part-0", env) == "s3://bucket/corpus/part-0"


def test_input_path_is_the_path_itself_on_the_machine_that_read_it(dataset):
    assert burst.input_path(dataset / "tokens.bin", {}) == str(dataset / "tokens.bin")


def test_input_path_reads_a_tilde_as_the_home_of_the_machine_that_read_it(store, dataset,
                                                                         tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(dataset.parent))
    stage(store, dataset)
    shutil.rmtree(dataset)
    place.place(store, "run", tmp_path / "node", say=lambda _l: None)
    env = {names.MAP_ENV: place.node_env(tmp_path / "node")[names.MAP_ENV]}
    monkeypatch.setenv("HOME", str(tmp_path / "node-home"))  # the node's own home
    assert burst.input_path("~/data/tokens.bin", env) == str(dataset / "tokens.bin")


def test_a_run_without_inputs_places_nothing(store, tmp_path):
    assert place.place(store, "run", tmp_path / "node", say=lambda _l: None) is None
    assert place.node_env(tmp_path / "node") == {}


def test_the_node_says_which_file_the_run_read_was_not_shipped(store, dataset, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("BURST_INPUTS_MAX_BYTES", "1000")
    stage(store, dataset / "docs" / "doc0.txt", dataset / "tokens.bin")
    said: list[str] = []
    place.place(store, "run", tmp_path / "node", say=said.append)
    assert said[-1] == (f"warning: the run read {dataset / 'tokens.bin'}, which was not "
                        "shipped (over the size limit (21.0 MB > 1.0 kB: raise [inputs] "
                        "max_bytes or $BURST_INPUTS_MAX_BYTES)): the run here will not find it")


def test_an_input_inside_the_project_goes_beside_the_nodes_code(store, tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "vocab.json").write_text("[]")
    inputs = part.InputsPart("run", record=True, say=lambda _l: None)
    inputs.set_code(str(project), ["train.py"])  # data/ is gitignored: not in the archive
    (project / "data" / "vocab.json").read_text()
    inputs.stage(store)
    shutil.rmtree(project)  # the node has no project, and burst makes none
    code = tmp_path / "node" / "code"
    place.place(store, "run", tmp_path / "node", say=lambda _l: None, code_dir=code)
    assert (code / "data" / "vocab.json").read_text() == "[]" and not project.exists()
    env = node_view(tmp_path / "node")
    assert burst.input_path(project / "data" / "vocab.json", env) == str(code / "data"
                                                                          / "vocab.json")

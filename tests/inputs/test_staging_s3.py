"""Inputs in a real S3 store (moto on 127.0.0.1): content-addressed chunks shared by the
runs of the store, a JSON manifest per run, and only what changed is sent again."""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from burst.errors import ConfigError
from burst.inputs import chunks, part
from burst.store import open_store
from tests.helpers.store_servers import aws_env


class CountingStore:
    """A real store, counting the chunk PUTs that reach it."""

    def __init__(self, store) -> None:
        self.store, self.url, self.chunk_puts = store, store.url, []

    def put(self, key, data):
        if key.startswith(chunks.CHUNKS):
            self.chunk_puts.append(key)
        self.store.put(key, data)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.fixture
def s3(moto_s3, monkeypatch):
    aws_env(monkeypatch)
    return CountingStore(open_store(moto_s3.url(), **moto_s3.options()))


def staged(store, dataset, run_id="run"):
    inputs = part.InputsPart(run_id, [dataset], record=False, say=lambda _line: None)
    return inputs, inputs.stage(store)


def test_changing_one_file_of_a_data_folder_uploads_that_file_only(s3, dataset):
    staged(s3, dataset)
    first = len(s3.chunk_puts)
    assert first == 3 + 3  # tokens.bin: 3 chunks; three small documents: one each
    (dataset / "docs" / "doc1.txt").write_text("changed\n")
    _, manifest = staged(s3, dataset)
    assert len(s3.chunk_puts) - first == 1
    (doc,) = [f for f in manifest.files if f.path.endswith("doc1.txt")]
    assert s3.chunk_puts[-1] == chunks.chunk_key(doc.chunks[0])


def test_appending_to_a_token_file_uploads_its_last_chunk_only(s3, dataset):
    staged(s3, dataset)
    before = len(s3.chunk_puts)
    with open(dataset / "tokens.bin", "ab") as tokens:
        tokens.write(random.Random(1).randbytes(1000))
    staged(s3, dataset)
    assert len(s3.chunk_puts) - before == 1


def test_another_run_of_the_store_uploads_no_chunk_again(s3, dataset):
    staged(s3, dataset, "first")
    before = len(s3.chunk_puts)
    _, manifest = staged(s3, dataset, "second")
    assert len(s3.chunk_puts) == before and chunks.load(s3, "second") == manifest


def test_the_manifest_is_json_naming_each_files_size_mode_mtime_and_chunks(s3, dataset):
    staged(s3, dataset)
    data = json.loads(s3.get(chunks.manifest_key("run")))
    entry = next(f for f in data["files"] if f["path"] == str(dataset / "tokens.bin"))
    st = os.stat(dataset / "tokens.bin")
    assert (entry["size"], entry["mtime_ns"], entry["mode"]) == (st.st_size, st.st_mtime_ns,
                                                                 st.st_mode & 0o7777)
    assert len(entry["chunks"]) == 3 and data["inputs"][0]["env"] == "BURST_INPUT_DATA"


def test_pending_falls_to_zero_once_staged_and_rises_when_an_input_changes(s3, dataset):
    inputs = part.InputsPart("run", [dataset], record=False, say=lambda _line: None)
    assert inputs.pending(s3).bytes == (20 << 20) + 3 * len("document 0\n" * 100)
    inputs.stage(s3)
    assert inputs.pending(s3).ready
    (dataset / "docs" / "doc2.txt").write_text("new\n")
    assert inputs.pending(s3).bytes == len("new\n")


def test_a_restarted_process_finds_what_the_store_holds_already(s3, dataset):
    staged(s3, dataset)
    again = part.InputsPart("run", [dataset], record=False, say=lambda _line: None)
    assert again.pending(s3).ready


def test_resume_uploads_the_chunks_a_run_died_before_staging(s3, dataset):
    _, manifest = staged(s3, dataset)
    for digest in manifest.files[0].chunks:
        s3.delete(chunks.chunk_key(digest))
    said = []
    assert part.for_resume(s3, "run", say=said.append) == ([], {})
    assert not manifest.missing(chunks.stored_chunks(s3)) and "uploaded 1 input" in said[0]


def test_resume_refuses_an_unstaged_input_that_changed_since_the_run_read_it(s3, dataset):
    _, manifest = staged(s3, dataset)
    (tokens,) = [f for f in manifest.files if f.path.endswith("tokens.bin")]
    s3.delete(chunks.chunk_key(tokens.chunks[0]))
    (dataset / "tokens.bin").write_bytes(b"another data set")
    with pytest.raises(ConfigError, match=r"tokens\.bin is not in the store yet and changed"):
        part.for_resume(s3, "run")


def test_resume_refuses_an_input_that_cannot_be_shipped_in_one_line(s3, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    part.InputsPart("run", [tmp_path / "pipe"], record=False, say=lambda _l: None).stage(s3)
    with pytest.raises(ConfigError) as refused:
        part.for_resume(s3, "run")
    assert "pipe cannot be shipped to a node: a device, FIFO or socket" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_run_killed_before_staging_leaves_a_draft_that_resume_completes(s3, dataset,
                                                                           tmp_path):
    inputs = part.InputsPart("run", [dataset], record=False, say=lambda _line: None)
    drafted = inputs.draft(s3)  # what the persisted snapshot wrote; then the kill
    assert not any(f.hashed for f in drafted.files) and not s3.chunk_puts
    part.for_resume(s3, "run", say=lambda _line: None)
    completed = chunks.load(s3, "run")
    assert completed is not None and all(f.hashed for f in completed.files)
    assert not completed.missing(chunks.stored_chunks(s3))


def test_a_draft_names_a_file_that_changed_since_it_was_staged_by_its_new_stat(s3, dataset):
    inputs, _ = staged(s3, dataset)
    (dataset / "docs" / "doc0.txt").write_text("edited after staging\n")
    drafted = inputs.draft(s3)
    (doc,) = [f for f in drafted.files if f.path.endswith("doc0.txt")]
    assert not doc.hashed and doc.size == len("edited after staging\n")


def test_a_persisted_snapshot_writes_the_draft_in_the_background(s3, dataset):
    part.declare(s3, "run", [dataset])
    part.refresh(s3, "run")
    deadline = time.monotonic() + 30
    while chunks.load(s3, "run") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chunks.load(s3, "run") is not None

"""The recorder: the files a training process reads, found by an audit hook on ``open``
(and in its memory maps and open files), each once, and never the files it writes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np

from burst.inputs import recorder


def test_a_file_read_after_start_is_recorded(dataset):
    recorder.start()
    (dataset / "docs" / "doc0.txt").read_text()
    assert str(dataset / "docs" / "doc0.txt") in recorder.collect()


def test_a_relative_path_is_recorded_absolute(dataset, monkeypatch):
    recorder.start()
    monkeypatch.chdir(dataset / "docs")
    with open("doc1.txt") as source:
        source.read()
    assert str(dataset / "docs" / "doc1.txt") in recorder.collect()


def test_a_file_opened_for_writing_is_not_an_input(tmp_path):
    recorder.start()
    (tmp_path / "out.txt").write_text("written")
    with open(tmp_path / "log.txt", "a") as log:
        log.write("appended")
    found = recorder.collect()
    assert str(tmp_path / "out.txt") not in found and str(tmp_path / "log.txt") not in found


def test_a_path_read_many_times_is_recorded_once(dataset):
    recorder.start()
    for _ in range(3):
        (dataset / "docs" / "doc2.txt").read_text()
    assert recorder.collect().count(str(dataset / "docs" / "doc2.txt")) == 1


def test_nothing_is_recorded_while_stopped(dataset):
    recorder.start()
    recorder.stop()
    (dataset / "docs" / "doc0.txt").read_text()
    assert str(dataset / "docs" / "doc0.txt") not in recorder.collect()


def test_a_token_file_memmapped_before_recording_started_is_found(dataset):
    tokens = np.memmap(dataset / "tokens.bin", dtype=np.uint8, mode="r")
    assert str(dataset / "tokens.bin") in recorder.collect()
    del tokens


def test_a_forked_worker_reports_what_it_read(dataset):
    recorder.start()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: reads a shard, then leaves without cleanup
        (dataset / "docs" / "doc1.txt").read_text()
        time.sleep(recorder.FLUSH_SECONDS * 4)
        os._exit(0)
    os.waitpid(pid, 0)
    assert str(dataset / "docs" / "doc1.txt") in recorder.collect()


def test_reads_of_bursts_own_threads_are_not_the_runs(dataset):
    recorder.start()
    reader = threading.Thread(target=(dataset / "docs" / "doc0.txt").read_text,
                              name="burst-freeze")
    reader.start()
    reader.join()
    assert str(dataset / "docs" / "doc0.txt") not in recorder.collect()


def test_a_run_started_later_is_not_given_what_an_earlier_one_read(dataset):
    recorder.start()
    (dataset / "docs" / "doc0.txt").read_text()
    since = recorder.mark()
    (dataset / "docs" / "doc1.txt").read_text()
    found = recorder.collect(since)
    assert str(dataset / "docs" / "doc1.txt") in found
    assert str(dataset / "docs" / "doc0.txt") not in found


def test_a_file_both_runs_read_is_recorded_for_the_later_one_too(dataset):
    recorder.start()
    (dataset / "docs" / "doc0.txt").read_text()
    since = recorder.mark()
    (dataset / "docs" / "doc0.txt").read_text()
    assert str(dataset / "docs" / "doc0.txt") in recorder.collect(since)


def test_recording_goes_on_until_the_last_run_stops(dataset):
    recorder.start()
    recorder.start()
    recorder.stop()
    assert recorder.recording()
    recorder.stop()
    assert not recorder.recording()


def test_a_recording_process_leaves_no_folder_behind_after_its_forked_worker_exits(tmp_path):
    """The folder workers report into was left in the user's temporary folder by every
    process that recorded, one per run (thousands on a busy machine). A forked worker's
    exit must not take it from the parent still recording."""
    program = (
        "import os, sys\n"
        "from burst.inputs import recorder\n"
        "folder = recorder.start()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # a worker's exit runs its exit handlers\n"
        "os.waitpid(pid, 0)\n"
        "assert folder.is_dir(), 'a worker took the folder'\n"
        "print(folder)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)}, check=False)
    assert done.returncode == 0, done.stderr
    assert str(tmp_path) in done.stdout
    assert not list(tmp_path.glob("burst-inputs-*"))

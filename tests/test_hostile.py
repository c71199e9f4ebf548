"""Hostile snapshots and stores: reading one can fail, but never escape, allocate or execute.

An attacker here controls a store (or a snapshot copied from one): manifests, blobs, the
run's other files and the key listing. Each test plants something and checks that burst
refuses it with a ``BurstError`` and that nothing happened outside the store: no file
written elsewhere, no pickle run (a canary file would appear), no huge allocation.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import burst
from burst import events
from burst.cli import main
from burst.env.stager import STAGE_ENV
from burst.errors import BurstError, SnapshotError, StoreError
from burst.inputs.names import RECORD_ENV
from burst.snapshot import format as fmt
from burst.snapshot import reader, retention, sync
from burst.snapshot.tensors import load_tensors
from burst.state import capture as state
from burst.store import LocalStore, open_store
from tests.helpers.store_servers import aws_env

RUN = "victim"


class Exploit:
    """Unpickling this creates the canary file: proof that a pickle was executed."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self):
        return (Path.touch, (self.canary,))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def _good_run(root: Path) -> LocalStore:
    store = LocalStore(root)
    run = burst.Run(RUN, store=store, global_batch=2, persist_seconds=None)
    run.attach(_model())
    run.snapshot("manual", wait=True)
    return store


def _manifest_path(store: LocalStore) -> Path:
    return store.root / fmt.manifest_key(RUN, reader.list_steps(store, RUN)[-1])


def _rewrite(store: LocalStore, change) -> None:
    path = _manifest_path(store)
    manifest = json.loads(path.read_bytes())
    change(manifest)
    text = json.dumps(manifest).replace('"NESTED"', "[" * 5000 + "]" * 5000)
    path.write_bytes(text.encode())


def _resume(store: LocalStore) -> None:
    burst.Run(RUN, store=store, global_batch=2).attach(_model())


@pytest.fixture(autouse=True)
def _no_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BURST_FREEZE", "0")
    # nor staging or input recording: what they write into <run>/env/ (the inputs' draft,
    # the stager's parts) races the links these tests plant there
    monkeypatch.setenv(STAGE_ENV, "0")
    monkeypatch.setenv(RECORD_ENV, "0")


@pytest.mark.parametrize("bad_run", ["../other", "/etc", "victim/../../x", "a\\b", ""])
def test_run_ids_that_leave_the_store_are_refused(tmp_path: Path, bad_run: str) -> None:
    store = _good_run(tmp_path / "store")
    for call in (lambda: reader.list_steps(store, bad_run),
                 lambda: reader.read_manifest(store, bad_run, 0),
                 lambda: sync.push(store, LocalStore(tmp_path / "dst"), bad_run)):
        with pytest.raises(BurstError):
            call()
    assert not (tmp_path / "other").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("change, why", [
    (lambda m: m.update(run_id="someone-else"), "belongs to run"),
    (lambda m: m["blobs"].update({"../../../etc/passwd": {"size": 1}}), "not a hex digest"),
    (lambda m: m["blobs"].update({"/abs": {"size": 1}}), "not a hex digest"),
    (lambda m: [e.update(blob="../" + e["blob"]) for e in m["tensors"].values()], "no valid"),
    (lambda m: [e.update(dtype="object") for e in m["tensors"].values()], "unknown dtype"),
    (lambda m: [e.update(shape=[e["shape"][0] + 1, *e["shape"][1:]])
                for e in m["tensors"].values() if e["shape"]], "declares"),
    (lambda m: [e.update(offset=10**12) for e in m["tensors"].values()], "outside its blob"),
    (lambda m: [e.update(shape=[0, 2**70], nbytes=0) for e in m["tensors"].values()],
     "malformed shape"),
    (lambda m: m.update(state="NESTED"), "nested too deeply"),
    (lambda m: m["state"].update(rng={"python": "x"}), "RNG state is malformed"),
    (lambda m: m.update(step=10**30), "not a step number"),
    (lambda m: m.update(step=m["step"] + 1), "not the step its name says"),
    (lambda m: m.update(blobs={d + "\n": i for d, i in m["blobs"].items()}), "not a hex digest"),
])
def test_malformed_manifests_are_refused_before_anything_changes(tmp_path: Path, change,
                                                                  why: str) -> None:
    store = _good_run(tmp_path / "store")
    _rewrite(store, change)
    model = _model()
    with torch.no_grad():
        model.weight.fill_(7.0)
    with pytest.raises(SnapshotError, match=why):
        burst.Run(RUN, store=store, global_batch=2).attach(model)
    assert torch.all(model.weight == 7.0)  # refused before the model was touched


def test_a_blob_that_does_not_match_its_hash_is_refused(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    blob = next(p for p in (store.root / RUN / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    for call in (lambda: reader.verify(store, RUN), lambda: _resume(store),
                 lambda: sync.pull(store, LocalStore(tmp_path / "dst"), RUN),
                 lambda: sync.push(store, LocalStore(tmp_path / "dst2"), RUN)):
        blob.write_bytes(bytes(data))  # each path meets it (one that finds it deletes it)
        with pytest.raises(SnapshotError, match="corrupt"):
            call()
    assert reader.list_steps(LocalStore(tmp_path / "dst"), RUN) == []


def test_sizes_are_checked_before_anything_is_allocated(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    manifest = json.loads(_manifest_path(store).read_bytes())
    digest = next(iter(manifest["blobs"]))
    blob = store.root / fmt.blob_key(RUN, digest)
    with open(blob, "r+b") as f:  # sparse: a "blob" of 1 TiB the store says it holds
        f.truncate(1 << 40)
    with pytest.raises(SnapshotError, match="the manifest says"):
        load_tensors(store, manifest)
    manifest["blobs"][digest]["size"] = 1 << 40  # now the manifest claims it too
    with pytest.raises(SnapshotError):
        load_tensors(store, fmt.parse_manifest(json.dumps(manifest).encode()))
    path = _manifest_path(store)
    with open(path, "r+b") as f:  # a sparse 1 GiB "manifest"
        f.truncate(fmt.MAX_MANIFEST_BYTES + 1)
    with pytest.raises(SnapshotError, match="too big to be a manifest"):
        reader.read_manifest(store, RUN)


def _plant_pickles(store: LocalStore, canary: Path) -> None:
    """A pickle (and a torch.save zip, which is one) everywhere a naive loader might look."""
    payload = pickle.dumps(Exploit(canary))
    buffer = io.BytesIO()
    torch.save({"model": Exploit(canary)}, buffer)
    saved = buffer.getvalue()
    manifest = json.loads(_manifest_path(store).read_bytes())
    for data in (payload, saved):  # as blobs with the right hash, named by a tensor entry
        digest = fmt.digest(data, fmt.hash_of(manifest))
        store.put(fmt.blob_key(RUN, digest), data)
        manifest["blobs"][digest] = {"size": len(data)}
        manifest["tensors"][f"planted/{digest[:6]}"] = {
            "blob": digest, "dtype": "uint8", "shape": [len(data)], "offset": 0,
            "nbytes": len(data)}
    _manifest_path(store).write_bytes(json.dumps(manifest).encode())
    step = reader.list_steps(store, RUN)[-1]
    store.put(fmt.manifest_key(RUN, step + 1), payload)  # a "manifest" that is a pickle
    for key in ("env/lockfile.json", "env/lock.json", "code/latest.json", "events.jsonl",
                "env/facts.json", f"uploads/{step + 2:012d}.json"):
        store.put(f"{RUN}/{key}", payload)
    store.put(f"{RUN}/model.pt", saved)


def test_planted_pickles_never_execute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    canary = tmp_path / "PWNED"
    store = _good_run(tmp_path / "store")
    _plant_pickles(store, canary)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    url = str(store.root)
    for args in (["ls", "--store", url], ["ls", RUN, "--store", url],
                 ["show", RUN, "--store", url], ["verify", RUN, "--all", "--store", url],
                 ["status", RUN, "--store", url], ["gc", RUN, "--store", url, "--dry-run"],
                 ["pull", RUN, "--store", url, "--local", str(tmp_path / "pulled")],
                 ["env", "check", RUN, "--store", url],
                 ["report", RUN, "--store", url, "--out", str(tmp_path / "report")]):
        result = runner.invoke(main, args)
        assert "Traceback" not in result.output, (args, result.output)
    for call in (lambda: _resume(store), lambda: reader.verify(store, RUN)):
        with contextlib.suppress(BurstError):
            call()
    assert not canary.exists(), "a planted pickle was executed"


def test_hostile_keys_in_a_listing_are_ignored(moto_s3, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 listing is the server's word; keys with ``..`` never become local paths."""
    aws_env(monkeypatch)
    url = moto_s3.url()
    remote = open_store(url, **moto_s3.options())
    source = _good_run(tmp_path / "src")
    sync.push(source, remote, RUN)
    client, prefix = moto_s3.client(), url.split("/", 3)[3]
    for key in (f"{RUN}/env/../../../escaped", f"{RUN}/env/a b", f"{RUN}/blobs/../x"):
        client.put_object(Bucket="burst", Key=f"{prefix}/{key}", Body=b"evil")
    assert all(".." not in k and " " not in k for k in remote.list(f"{RUN}/"))
    local = LocalStore(tmp_path / "work" / "dst")
    sync.pull(remote, local, RUN)
    reader.verify(local, RUN)
    escaped = [p for p in tmp_path.rglob("*") if p.name in ("escaped", "x", "a b")]
    assert escaped == []
    retention.gc(remote, RUN, keep_last=1)  # a hostile key does not stop GC either


def test_a_planted_symlink_is_not_written_through(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    target = tmp_path / "bashrc"
    target.write_text("original\n")
    events = store.root / RUN / "events.jsonl"
    events.unlink()
    os.symlink(target, events)
    with pytest.raises(OSError):
        store.append(f"{RUN}/events.jsonl", b"{}\n")
    store.put(f"{RUN}/env/x", b"data")  # put replaces a link, never follows it
    assert target.read_text() == "original\n"


def test_state_decoding_builds_only_plain_values(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    manifest = reader.read_manifest(store, RUN)
    assert manifest is not None
    manifest["state"]["extra"] = {"$dict": [["__class__", {"$dtype": "float32"}]],
                                  "x": {"$tuple": [{"$float": "nan"}]}}
    decoded = state.decode(manifest, load_tensors(store, manifest))
    kinds = set()

    def walk(value: object) -> None:
        kinds.add(type(value))
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(decoded)
    assert kinds <= {dict, list, tuple, str, int, float, bool, type(None), torch.Tensor,
                     torch.dtype}


# -- round two (issue 18): links, history lines, names, fallbacks, sizes, leftovers ----------


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, (args, result.output)
    return result.exit_code, result.output


def test_a_directory_symlink_never_takes_writes_outside_the_store(tmp_path: Path) -> None:
    source = _good_run(tmp_path / "src")
    manifest = reader.read_manifest(source, RUN)
    assert manifest is not None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dst = LocalStore(tmp_path / "dst")
    (dst.root / RUN / "blobs").mkdir(parents=True)
    for digest in manifest["blobs"]:
        os.symlink(elsewhere, dst.root / RUN / "blobs" / digest[:2])
    with pytest.raises(StoreError, match="symbolic link"):
        sync.push(source, dst, RUN)
    assert list(elsewhere.iterdir()) == []
    assert reader.list_steps(dst, RUN) == []


def test_reads_never_follow_a_symlink_out_of_the_store(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "lockfile.json").write_text("secret")
    os.symlink(outside, store.root / RUN / "env")
    (store.root / RUN / "events.jsonl").unlink()
    os.symlink(outside / "lockfile.json", store.root / RUN / "events.jsonl")
    for key in (f"{RUN}/env/lockfile.json", f"{RUN}/events.jsonl"):
        with pytest.raises(StoreError, match="symbolic link"):
            store.get(key)
    listed = store.list(f"{RUN}/")
    assert not [k for k in listed if "/env/" in k or k.endswith("events.jsonl")], listed
    (store.root / RUN / "events.jsonl").unlink()
    dst = LocalStore(tmp_path / "dst")
    with pytest.raises(StoreError, match="symbolic link"):
        sync.pull(store, dst, RUN)  # listing env/ would lead outside: refused, not walked
    assert not (dst.root / RUN / "env").exists()


def test_a_deeply_nested_event_line_costs_a_warning_not_the_command(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    store.append(f"{RUN}/events.jsonl", b'{"a":' * 50000 + b"\n")
    url = str(store.root)
    for args in (["status", RUN, "--store", url],
                 ["report", RUN, "--store", url, "--out", str(tmp_path / "report")],
                 ["pull", RUN, "--store", url, "--local", str(tmp_path / "pulled")]):
        code, output = _cli(*args)
        assert code == 0, (args, output)


def test_manifest_names_that_no_step_has_are_not_listed(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    (step,) = reader.list_steps(store, RUN)
    data = _manifest_path(store).read_bytes()
    for name in ("99999999999999999999999.json", "7.json", "000000000007.json\n",
                 "\u0660" * 11 + "\u0667.json"):  # Arabic-Indic digits
        (_manifest_path(store).parent / name).write_bytes(data)
    assert reader.list_steps(store, RUN) == [step]
    code, output = _cli("ls", RUN, "--store", str(store.root))
    assert code == 0 and output.count(RUN) >= 1 and "99999" not in output


def test_a_manifest_renamed_to_another_step_is_refused(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    (step,) = reader.list_steps(store, RUN)
    path = _manifest_path(store)
    path.rename(path.with_name(f"{step + 7:012d}.json"))
    with pytest.raises(SnapshotError, match="not the step its name says"):
        reader.verify(store, RUN)
    code, output = _cli("verify", RUN, "--store", str(store.root))
    assert code == 1 and len(output.strip().splitlines()) == 1


@pytest.mark.parametrize("step", [10**30, 10**12, -1, True, 7.0])
def test_steps_out_of_range_are_refused_on_read(tmp_path: Path, step: object) -> None:
    store = _good_run(tmp_path / "store")
    _rewrite(store, lambda m: m.update(step=step))
    with pytest.raises(SnapshotError, match="step"):
        reader.verify(store, RUN)
    with pytest.raises(SnapshotError, match="not a step number"):
        reader.read_manifest(store, RUN, 10**30)


def test_a_digest_with_a_trailing_newline_is_refused_by_ls_and_show(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")

    def add_newline(m: dict) -> None:
        m["blobs"] = {d + "\n": info for d, info in m["blobs"].items()}
        for entry in m["tensors"].values():
            entry["blob"] += "\n"

    _rewrite(store, add_newline)
    with pytest.raises(SnapshotError, match="not a hex digest"):
        reader.read_manifest(store, RUN)
    for command in ("show", "ls"):
        code, output = _cli(command, RUN, "--store", str(store.root))
        assert code == 1 and "not a hex digest" in output, (command, output)


def _two_snapshots(store: LocalStore) -> str:
    """Steps 0 and 5 of one run; returns the digest of the blob only step 5 has."""
    run = burst.Run(RUN, store=store, global_batch=2, persist_seconds=None, keep=5)
    model = _model()
    run.attach(model)
    run.snapshot("manual", wait=True)
    with torch.no_grad():
        model.weight.add_(1.0)
    run.step = 5
    run.snapshot("manual", wait=True)
    old, new = (reader.read_manifest(store, RUN, s) for s in (0, 5))
    assert old is not None and new is not None
    (digest,) = set(new["blobs"]) - set(old["blobs"])
    return digest


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("damage", ["blob", "manifest"])
def test_a_corrupt_newest_snapshot_falls_back_loudly_on_every_store(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        where: str, damage: str) -> None:
    written = LocalStore(tmp_path / "written")
    digest = _two_snapshots(written)
    store: object = written
    if where == "s3":
        moto_s3 = request.getfixturevalue("moto_s3")
        aws_env(monkeypatch)
        store = open_store(moto_s3.url(), **moto_s3.options())
        sync.push(written, store, RUN, every=True)  # type: ignore[arg-type]
    if damage == "blob":
        key = fmt.blob_key(RUN, digest)
        data = bytearray(store.get(key))  # type: ignore[attr-defined]
        data[0] ^= 1
        store.put(key, bytes(data))  # type: ignore[attr-defined]
    else:
        store.put(fmt.manifest_key(RUN, 5), b"{not json")  # type: ignore[attr-defined]
    run = burst.Run(RUN, store=store, local=str(tmp_path / "tier"), global_batch=2)
    with pytest.warns(RuntimeWarning, match="falling back to step 0"):
        restored = run.attach(_model())
    assert restored is not None and restored.step == 0
    skipped = [e for e in events.read(run.local, RUN) if e["event"] == "snapshot-skipped"]
    assert len(skipped) == 1 and f"{RUN}@5" in skipped[0]["message"]


def test_a_manifest_with_more_entries_than_any_model_is_refused_in_one_line(
        tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    path = _manifest_path(store)
    text = path.read_text()  # written as encode_manifest does: '"blobs":{' then entries
    extra = "".join(f'"{i:064x}":{{"size":0}},' for i in range(fmt.MAX_MANIFEST_ENTRIES))
    path.write_text(re.sub(r'"blobs":\s*\{', lambda m: m.group(0) + extra, text, count=1))
    assert path.stat().st_size <= fmt.MAX_MANIFEST_BYTES
    code, output = _cli("show", RUN, "--store", str(store.root))
    assert code == 1 and "more than any real model" in output
    assert len(output.strip().splitlines()) == 1


def test_a_manifest_over_the_byte_cap_is_refused_unread(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    with open(_manifest_path(store), "r+b") as f:  # sparse: reading it would cost 64 MiB
        f.truncate(fmt.MAX_MANIFEST_BYTES + 1)
    code, output = _cli("show", RUN, "--store", str(store.root))
    assert code == 1 and "too big to be a manifest" in output


def test_gc_sweeps_a_stale_temporary_left_in_the_store(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    stale = store.root / RUN / "uploads" / ".000000000009.json.x1y2z3.tmp"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b'{"time": 0, "bl')  # a marker write killed mid-way
    then = time.time() - retention.TEMP_TTL - 60
    os.utime(stale, (then, then))
    code, output = _cli("gc", RUN, "--store", str(store.root))
    assert code == 0, output
    assert not stale.exists()


_NOW = "2026-01-01T00:00:00.000+00:00"


@pytest.mark.parametrize("line", [
    {"time": _NOW, "event": "metrics", "points": [{"t": "x", "step": 1, "loss": 1.0}]},  # str
    {"time": _NOW, "event": "gpu-sample", "gpus": [[1, 2]]},  # a list where a dict is
    {"time": None, "event": "start"},  # null
    {"time": _NOW, "event": "metrics", "points": [{"t": 10**400, "step": 1, "loss": 1.0}]},
    {"time": _NOW, "event": "memory-alert", "threshold": {"a": {"b": 1}}},  # nested object
    {"time": True, "event": "start"},  # a bool
    {"time": -1, "event": "start"},  # a negative time
    {"time": _NOW, "event": "ssh-job", "target": "t", "dir": "d", "pid": "abc"},
], ids=["string", "list", "null", "huge-int", "nested", "bool", "negative-time", "pid"])
def test_an_event_with_a_field_of_the_wrong_type_costs_a_warning_not_the_command(
        tmp_path: Path, line: dict) -> None:
    store = _good_run(tmp_path / "store")
    store.append(f"{RUN}/events.jsonl", json.dumps(line).encode() + b"\n")
    with pytest.warns(RuntimeWarning, match="skipped 1 line"):
        assert [e["event"] for e in events.read(store, RUN)][-1] == "snapshot"
    url = str(store.root)
    for args in (["status", RUN, "--store", url],
                 ["report", RUN, "--store", url, "--out", str(tmp_path / "report")]):
        code, output = _cli(*args)
        assert code == 0, (args, output)


@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(batch=[2, 2]), "'batch'"),
    (lambda m: m.update(batch={"micro": "2"}), "'batch'"),
    (lambda m: m.update(memory={"peak_bytes_by_micro_batch": "x"}), "'memory'"),
])
def test_a_manifest_section_of_the_wrong_type_is_refused_in_one_line(
        tmp_path: Path, change, field: str) -> None:
    store = _good_run(tmp_path / "store")
    _rewrite(store, change)
    url = str(store.root)
    for args in (["status", RUN, "--store", url], ["verify", RUN, "--store", url],
                 ["report", RUN, "--store", url, "--out", str(tmp_path / "report")]):
        code, output = _cli(*args)
        assert code == 1 and field in output, (args, output)
        assert len(output.strip().splitlines()) == 1, output


def test_a_snapshot_time_without_a_zone_is_shown_not_a_crash(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    _rewrite(store, lambda m: m.update(time="2026-01-01T00:00:00"))
    code, output = _cli("status", RUN, "--store", str(store.root))
    assert code == 0, output


CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: writes the terminal's clipboard
CLEAR = "\x1b[2J\x9b2J"  # CSI 2J (7-bit and 8-bit): clears the screen


def test_escape_sequences_a_store_holds_never_reach_the_terminal(tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    _rewrite(store, lambda m: m.update(reason=CLIPBOARD, card=CLEAR, time=CLEAR))
    events.append(store, RUN, "failure", kind=CLIPBOARD, step=0, message=CLEAR)
    url = str(store.root)
    for args in (["ls", "--store", url], ["ls", RUN, "--store", url],
                 ["status", "--store", url], ["status", RUN, "--store", url],
                 ["status", RUN, "--store", url, "--once"],
                 ["show", RUN, "--store", url], ["verify", RUN, "--store", url],
                 ["status", RUN, "--store", url, "--json"],
                 ["report", RUN, "--store", url, "--out", str(tmp_path / "report")]):
        code, output = _cli(*args)
        assert code == 0, (args, output)
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", output), (args, output)
    code, output = _cli("ls", RUN, "--store", url)
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in output  # shown, as an escape, not acted on


PEAK = """
import sys, tracemalloc
from burst.errors import SnapshotError
from burst.snapshot import format as fmt
data = open(sys.argv[1], "rb").read()
tracemalloc.start()
try:
    fmt.parse_manifest(data)
    print("parsed", tracemalloc.get_traced_memory()[1])
except SnapshotError:
    print("refused", tracemalloc.get_traced_memory()[1])
"""


def test_a_manifest_of_a_million_empty_objects_is_refused_in_memory_bounded_by_its_size(
        tmp_path: Path) -> None:
    store = _good_run(tmp_path / "store")
    path = _manifest_path(store)
    text = path.read_text()  # a valid manifest, plus a field no check walks: 3 MiB of {}
    path.write_text(text[:-1] + ',"notes":[' + ",".join(["{}"] * 1_100_000) + "]}")
    size = path.stat().st_size
    assert size <= fmt.MAX_MANIFEST_BYTES
    with pytest.raises(SnapshotError, match="JSON objects and arrays: more than"):
        reader.read_manifest(store, RUN)
    # measured in a process of its own: no other test's threads allocate meanwhile
    done = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    refused, peak = done.stdout.split()
    assert refused == "refused" and int(peak) < 3 * size, (peak, size)  # parsed: 25x
    for command in ("verify", "show", "ls"):
        code, output = _cli(command, RUN, "--store", str(store.root))
        assert code == 1 and "objects and arrays: more than" in output, (command, output)
        assert len(output.strip().splitlines()) == 1


def test_a_pull_falls_back_when_the_newest_snapshots_blob_folder_leads_out_of_the_store(
        tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    digest = _two_snapshots(store)
    folder = (store.root / fmt.blob_key(RUN, digest)).parent
    old = reader.read_manifest(store, RUN, 0)
    assert old is not None and not any(d[:2] == digest[:2] for d in old["blobs"])
    shutil.move(folder, tmp_path / "outside")
    os.symlink(tmp_path / "outside", folder)
    code, output = _cli("pull", RUN, "--store", str(store.root),
                        "--local", str(tmp_path / "pulled"))
    assert code == 0, output
    assert "falling back to step 0" in output
    assert reader.list_steps(LocalStore(tmp_path / "pulled"), RUN) == [0]

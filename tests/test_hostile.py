"""Hostile snapshots and stores: reading one can fail, but never escape, allocate or execute.

An attacker here controls a store (or a snapshot copied from one): manifests, blobs, the
run's other files and the key listing. Each test plants something and checks that burst
refuses it with a ``BurstError`` and that nothing happened outside the store: no file
written elsewhere, no pickle run (a canary file would appear), no huge allocation.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import burst
from burst.cli import main
from burst.errors import BurstError, SnapshotError
from burst.snapshot import format as fmt
from burst.snapshot import reader as snapshot
from burst.snapshot import sync
from burst.snapshot.tensors import load_tensors
from burst.state import capture as state
from burst.store import LocalStore, open_store
from tests.store_servers import aws_env

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
    return store.root / fmt.manifest_key(RUN, snapshot.list_steps(store, RUN)[-1])


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


@pytest.mark.parametrize("bad_run", ["../other", "/etc", "victim/../../x", "a\\b", ""])
def test_run_ids_that_leave_the_store_are_refused(tmp_path: Path, bad_run: str) -> None:
    store = _good_run(tmp_path / "store")
    for call in (lambda: snapshot.list_steps(store, bad_run),
                 lambda: snapshot.read_manifest(store, bad_run, 0),
                 lambda: sync.push(store, LocalStore(tmp_path / "dst"), bad_run)):
        with pytest.raises(BurstError):
            call()
    assert not (tmp_path / "other").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("change, why", [
    (lambda m: m.update(run_id="someone-else"), "belongs to run"),
    (lambda m: m["blobs"].update({"../../../etc/passwd": {"size": 1}}), "not a SHA-256"),
    (lambda m: m["blobs"].update({"/abs": {"size": 1}}), "not a SHA-256"),
    (lambda m: [e.update(blob="../" + e["blob"]) for e in m["tensors"].values()], "no valid"),
    (lambda m: [e.update(dtype="object") for e in m["tensors"].values()], "unknown dtype"),
    (lambda m: [e.update(shape=[e["shape"][0] + 1, *e["shape"][1:]])
                for e in m["tensors"].values() if e["shape"]], "declares"),
    (lambda m: [e.update(offset=10**12) for e in m["tensors"].values()], "outside its blob"),
    (lambda m: [e.update(shape=[0, 2**70], nbytes=0) for e in m["tensors"].values()],
     "malformed shape"),
    (lambda m: m.update(state="NESTED"), "nested too deeply"),
    (lambda m: m["state"].update(rng={"python": "x"}), "RNG state is malformed"),
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
    blob.write_bytes(bytes(data))
    for call in (lambda: snapshot.verify(store, RUN), lambda: _resume(store),
                 lambda: sync.pull(store, LocalStore(tmp_path / "dst"), RUN),
                 lambda: sync.push(store, LocalStore(tmp_path / "dst2"), RUN)):
        with pytest.raises(SnapshotError, match="corrupt"):
            call()
    assert snapshot.list_steps(LocalStore(tmp_path / "dst"), RUN) == []


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
        snapshot.read_manifest(store, RUN)


def _plant_pickles(store: LocalStore, canary: Path) -> None:
    """A pickle (and a torch.save zip, which is one) everywhere a naive loader might look."""
    payload = pickle.dumps(Exploit(canary))
    buffer = io.BytesIO()
    torch.save({"model": Exploit(canary)}, buffer)
    saved = buffer.getvalue()
    manifest = json.loads(_manifest_path(store).read_bytes())
    for data in (payload, saved):  # as blobs with the right hash, named by a tensor entry
        digest = hashlib.sha256(data).hexdigest()
        store.put(fmt.blob_key(RUN, digest), data)
        manifest["blobs"][digest] = {"size": len(data)}
        manifest["tensors"][f"planted/{digest[:6]}"] = {
            "blob": digest, "dtype": "uint8", "shape": [len(data)], "offset": 0,
            "nbytes": len(data)}
    _manifest_path(store).write_bytes(json.dumps(manifest).encode())
    step = snapshot.list_steps(store, RUN)[-1]
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
    for call in (lambda: _resume(store), lambda: snapshot.verify(store, RUN)):
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
    snapshot.verify(local, RUN)
    escaped = [p for p in tmp_path.rglob("*") if p.name in ("escaped", "x", "a b")]
    assert escaped == []
    from burst.snapshot import retention

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
    manifest = snapshot.read_manifest(store, RUN)
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

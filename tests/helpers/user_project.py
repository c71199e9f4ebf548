"""A real user's project, as a new user brings it (issue 29's test world), for the sealed
end-to-end tests: unlike ``tests/helpers/sealed_project.py``'s, its data is not synthesised in the
script, and its interpreter is not ours.

- ``$HOME`` is a directory of the test's (the user's home): the training data lives outside
  the project, in ``$HOME/data`` (a memmapped token file of a few MB and a folder of small
  text shards), and pretrained weights lie in a Hugging Face style hub cache,
  ``$HOME/.cache/huggingface/hub/models--burst--tiny-embed`` (a blob, a snapshot that links
  to it, ``refs/main``), loaded with ``torch.load(weights_only=True)`` through ``$HF_HOME``
  as the hub library resolves it; ``$HOME/notes/unread.txt`` is a file the run never reads.
- The project is a git repository with its own ``.venv`` (a venv of the base interpreter of
  burst's ``.venv``, seeing that one's packages through a ``.pth`` file: a user's venv, with
  torch and burst), a gitignored ``data/`` folder holding the vocabulary the script reads,
  and a ``.gitignore`` like a real one (``data/``, ``.venv/``, ``*.pkl``).
- The training command names the venv's interpreter by its absolute path, and the data set
  by its absolute path (as a shell expands ``~/data``).

The script trains a tiny language model whose embedding starts from the pretrained weights,
on windows of the token file and of the shards, and writes down what it read (SHA-256 of
each input) and what it saw (``--seen`` paths), so a test can check from inside a node that
the data came from the store: this machine's paths are not there, the placed copies are.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np

from tests.conftest import step_records

VOCAB = 64
ARGS = ("--samples", "64", "--epochs", "2")
HUB_REPO = "models--burst--tiny-embed"
REVISION = "0123456789abcdef0123456789abcdef01234567"

MODEL = '''\
"""The project's own module: the node gets it from the code archive, nowhere else."""
import torch


class TinyLM(torch.nn.Module):
    def __init__(self, embedding: torch.Tensor) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding.from_pretrained(embedding.clone(), freeze=False)
        self.mix = torch.nn.Linear(8 * embedding.shape[1], 32)
        self.head = torch.nn.Linear(32, embedding.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.mix(self.embed(x).flatten(1)))
        return self.head(torch.nn.functional.dropout(hidden, 0.2, self.training))
'''

TRAIN = '''\
"""Train a tiny language model on the user's data set and pretrained embedding."""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import burst
from model import TinyLM

p = argparse.ArgumentParser()
p.add_argument("--run-id")
p.add_argument("--store")
p.add_argument("--data", required=True)
p.add_argument("--samples", type=int, default=64)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--seen", nargs="*", default=[])
args = p.parse_args()
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
run = burst.Run(args.run_id, store=args.store, global_batch=16, micro_batch=8, keep=100,
                shadow_every=1, persist_every=2)
read = {}


def digest(path):
    with open(path, "rb") as source:
        read[path] = hashlib.sha256(source.read()).hexdigest()


data = burst.input_path(args.data)
tokens = np.memmap(os.path.join(data, "tokens.bin"), dtype=np.uint16, mode="r")
shards = [os.path.join(data, "shards", name)
          for name in sorted(os.listdir(os.path.join(data, "shards")))]
text = b"".join(open(shard, "rb").read() for shard in shards)
vocab = json.load(open("data/vocab.json"))  # the project's gitignored data folder
hub = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
repo = os.path.join(hub, "hub", "models--burst--tiny-embed")
revision = open(os.path.join(repo, "refs", "main")).read().strip()
weights = os.path.join(repo, "snapshots", revision, "embed.pt")
embedding = torch.load(weights, weights_only=True)["embedding"]
for path in (os.path.join(data, "tokens.bin"), *shards, "data/vocab.json", weights):
    digest(path)
with open("seen.json", "w") as out:
    json.dump({"paths": {path: os.path.exists(path) for path in args.seen}, "read": read,
               "data": data, "hf_home": os.environ.get("HF_HOME"),
               "inputs_map": os.environ.get("BURST_INPUTS_MAP"),
               "executable": sys.executable, "prefix": sys.prefix,
               "burst": burst.__file__, "torch": torch.__file__}, out)
stream = np.concatenate([np.asarray(tokens[: 9 * args.samples // 2], dtype=np.int64),
                         np.frombuffer(text, dtype=np.uint8).astype(np.int64) % len(vocab)])
windows = torch.from_numpy(stream[: 9 * args.samples].reshape(args.samples, 9).copy())
dataset = burst.SeededDataset(TensorDataset(windows[:, :8], windows[:, 8],
                                            torch.arange(args.samples)), seed=7)
model = TinyLM(embedding)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
run.attach(model, optimizer, scheduler)
sampler = burst.ResumableSampler(dataset, seed=3)
loader = DataLoader(dataset, batch_size=run.micro_batch, sampler=sampler)
with open("records.jsonl", "a") as records:
    for epoch in run.epochs(args.epochs):
        for step in run.steps(loader):
            indices, total = [], 0.0
            for x, y, index in step:
                loss = torch.nn.functional.cross_entropy(model(x), y) * step.weight(len(x))
                loss.backward()
                indices += index.tolist()
                total += loss.item()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            run.flush()
            records.write(json.dumps({"step": step.index, "loss": total.hex(),
                                      "indices": indices}) + "\\n")
            records.flush()
run.close()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict()}, "final.pt")
'''


def make_home(home: Path) -> Path:
    """The user's home: ``data/`` (token file, shards), a hub cache, an unread note."""
    data = home / "data"
    (data / "shards").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rng.integers(0, VOCAB, size=2_000_000, dtype=np.uint16).tofile(data / "tokens.bin")
    for i in range(12):
        (data / "shards" / f"shard-{i:02d}.txt").write_bytes(
            rng.integers(32, 127, size=2048, dtype=np.uint8).tobytes())
    import torch

    repo = home / ".cache" / "huggingface" / "hub" / HUB_REPO
    buffer = io.BytesIO()
    torch.save({"embedding": torch.randn(VOCAB, 16, generator=torch.Generator().manual_seed(5))},
               buffer)
    blob = hashlib.sha256(buffer.getvalue()).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob).write_bytes(buffer.getvalue())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    (repo / "snapshots" / REVISION / "embed.pt").symlink_to(f"../../blobs/{blob}")
    (home / "notes").mkdir()
    (home / "notes" / "unread.txt").write_text("this machine's, never read by the run\n")
    return home


def make_venv(venv: Path) -> Path:
    """The project's own venv: the base interpreter of burst's ``.venv``, which it sees
    through a ``.pth`` file (torch, burst and the rest: a user's installed packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_paths()["purelib"]
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "user-packages.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    return venv / "bin" / "python"


def make_project(root: Path) -> Path:
    """The git repository with its ``.venv``, its code and its gitignored ``data/``."""
    root.mkdir(parents=True)
    (root / "model.py").write_text(MODEL)
    (root / "train.py").write_text(TRAIN)
    (root / ".gitignore").write_text("data/\n.venv/\n*.pkl\n__pycache__/\n")
    (root / "data").mkdir()
    (root / "data" / "vocab.json").write_text(json.dumps([f"t{i}" for i in range(VOCAB)]))
    make_venv(root / ".venv")
    git = ["git", "-C", str(root), "-c", "user.name=user", "-c", "user.email=user@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tiny LM"], check=True)
    return root


def python_of(project: Path) -> str:
    return str(project / ".venv" / "bin" / "python")


def train_args(home: Path) -> tuple[str, ...]:
    return ("--data", str(home / "data"), *ARGS)


def reference(base: Path) -> tuple[list[dict], dict]:
    """The project trained without a stop (its own home, same bytes), on a local store."""
    home, project = make_home(base / "home"), make_project(base / "project")
    done = subprocess.run([python_of(project), "train.py", "--run-id", "reference", "--store",
                           str(project / ".burst"), *train_args(home)], cwd=project,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONHASHSEED": "0", "HOME": str(home)})
    assert done.returncode == 0, done.stderr[-3000:]
    import torch

    return (step_records(project / "records.jsonl"),
            torch.load(project / "final.pt", weights_only=True))

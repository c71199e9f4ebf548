"""Builders for the frozen-environment tests: a git project with planted secrets, tiny wheels."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

from burst.env import machine as envfacts
from burst.env.lockfile import Lockfile, Package

CANARY_FILE = "CANARY-in-a-secret-file-7f3a"
CANARY_KEY = "CANARYKEYMATERIAL9b1e"
CANARY_REMOTE = "ghp_CANARYremotetoken5c2d"
PRIVATE_KEY = (f"-----BEGIN OPENSSH PRIVATE KEY-----\n{CANARY_KEY}\n"
               f"-----END OPENSSH PRIVATE KEY-----\n")
SECRET_FILES = {
    ".env": f"API_TOKEN={CANARY_FILE}\n",
    "config/.env.production": f"DB_PASSWORD={CANARY_FILE}\n",
    "id_rsa": PRIVATE_KEY,
    "keys/server.pem": PRIVATE_KEY,
    "deploy/tls.key": PRIVATE_KEY,
    ".netrc": f"machine example.com login me password {CANARY_FILE}\n",
    ".pypirc": f"[pypi]\npassword = {CANARY_FILE}\n",
    "config/credentials.json": f'{{"secret": "{CANARY_FILE}"}}\n',
    ".aws/credentials": f"aws_secret_access_key = {CANARY_FILE}\n",
    "notes/backup.txt": PRIVATE_KEY,  # an innocent name, a key inside
}
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env={**os.environ, **_GIT_ENV}, check=True)
    return done.stdout.strip()


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_repo(root: Path) -> Path:
    """A committed project, then: an edit, a deletion, untracked and ignored files, an
    executable, an internal symlink, and every kind of secret file."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    write(root, "train.py", "print('v1')\n")
    write(root, "model/net.py", "WIDTH = 4\n")
    write(root, "old.py", "gone = True\n")
    write(root, ".gitignore", "*.log\ncheckpoints/\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    git(root, "remote", "add", "origin", f"https://alice:{CANARY_REMOTE}@git.example.com/t/p.git")
    write(root, "train.py", "print('v2: uncommitted')\n")
    (root / "old.py").unlink()
    write(root, "model/new_layer.py", "NEW = 1\n")
    run = write(root, "run.sh", "#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    (root / "model" / "latest.py").symlink_to("net.py")
    write(root, "train.log", "ignored\n")
    write(root, "checkpoints/ckpt.bin", "ignored\n")
    for rel, text in SECRET_FILES.items():
        write(root, rel, text)
    return root


def tree(root: Path) -> dict[str, tuple[str, bytes, bool]]:
    """Every file under ``root`` (no .git): kind, content (or link target), executable bit."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] == ".git" or (path.is_dir() and not path.is_symlink()):
            continue
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path).encode(), False)
        else:
            out[rel] = ("file", path.read_bytes(), bool(path.stat().st_mode & 0o100))
    return out


def build_wheel(directory: Path, name: str, version: str, source: str) -> Path:
    """A pure-Python wheel with one module named like the distribution, written by hand
    (no build backend, no network)."""
    directory.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}.py": source.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: burst-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    for rel, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for rel, data in files.items():
            wheel.writestr(rel, data)
    return path


def tiny_lockfile(*packages: Package) -> Lockfile:
    """A lockfile of the running Python with only ``packages`` (no torch)."""
    return Lockfile(packages=list(packages), python=envfacts.python_facts(),
                    platform=envfacts.platform_facts(), burst={"snapshot_format": 1})

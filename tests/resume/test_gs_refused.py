"""A ``gs://`` store is refused at ``burst resume`` in one line, before anything launches:
the node's stdlib bootstrap reads s3://, oss:// and sftp:// only, so such a node would be
paid for and then fail in setup. (A node with burst installed, ``--node-python``, reads
gs:// through gcsfs and is let through.)"""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_gs_store_is_refused_in_one_line_with_the_way_around(tmp_path):
    env = {**os.environ, "BURST_CONFIG": str(tmp_path / "none.toml"),
           "BURST_GCS_PROJECT": "burst-test",  # gcsfs warns without one
           # nothing leaves this machine: google-auth's metadata probe and GCS go to loopback
           "BURST_ENDPOINT_URL": "http://127.0.0.1:9", "NO_GCE_CHECK": "true",
           "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "burst.cli", "resume", "run", "--store",
                           "gs://ckpt-bucket/runs", "--local", str(tmp_path / "local"),
                           "--offline", "--to", "skypilot", "--", "python", "train.py"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout + done.stderr
    assert "gs://" in lines[0] and "bootstrap cannot read" in lines[0]
    assert "https://storage.googleapis.com" in lines[0] and "--node-python" in lines[0]

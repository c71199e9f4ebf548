"""The SSH rows: a real OpenSSH server on 127.0.0.1, reached through the launcher's own
connect path; a host whose key changed is refused, and the fix says how to check it."""

from __future__ import annotations

import subprocess

from burst.launch.ssh import Target
from burst.preflight.ssh import ssh_row
from burst.preflight.table import FAIL, OK


def test_a_known_host_passes(sshd):
    row = ssh_row(Target.parse("ssh://burst-test", str(sshd.config)))
    assert row.status == OK and "host key known" in row.detail


def test_a_changed_host_key_fails_with_the_fix(sshd, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
                   check=True)
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")  # what a reinstalled box looks like
    target = Target.parse("ssh://burst-test", str(sshd.config), known_hosts=str(known))
    row = ssh_row(target)
    assert row.status == FAIL and "does NOT match" in row.detail
    assert "ssh-keygen -R" in row.fix and str(known) in row.fix

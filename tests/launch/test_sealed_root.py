"""A sealed stub node whose system is another distribution's: its /usr, /lib and /etc come
from that root (a Debian 13 debootstrap), so the node runs that distribution's python3."""

from __future__ import annotations

import os
import subprocess

import pytest

from burst.errors import ConfigError
from burst.launch import sealed


def test_a_system_root_without_a_shell_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="holds no bash or setpriv"):
        sealed.system_root(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0 or sealed.problem() is not None,
                    reason="this machine cannot seal a node")
def test_a_node_on_debian_13_runs_debians_python_and_none_of_this_machines(tmp_path,
                                                                          other_distribution):
    node = sealed.Node(tmp_path / "root", tmp_path / "home", (),
                       sealed.system_root(other_distribution))
    node.prepare()
    script = ("python3 -c 'import sys; print(*sys.version_info[:2])'; "
              ". /etc/os-release; echo $VERSION_CODENAME; ls /usr/bin/python3.11 || true")
    done = subprocess.run(sealed.command(node, script), env=sealed.environment({}, node.home),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["3", "13", "trixie"]
    assert "No such file" in done.stderr  # this machine's 3.11 is not there

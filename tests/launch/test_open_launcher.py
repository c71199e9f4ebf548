"""open_launcher names a launcher as open_store names a store: ``--to``'s words, set up from
the resume options, and nothing started."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.launch import STUB_ROOT_ENV, open_launcher


def test_local_puts_its_nodes_under_the_stub_root_option(tmp_path):
    launcher = open_launcher("local", {"stub_root": str(tmp_path), "stub_fail_first": 2})
    assert (launcher.kind, launcher.root, launcher.faults.fail_first) == ("local", tmp_path.resolve(), 2)


def test_local_takes_its_root_from_the_environment_when_no_option_names_one(
        tmp_path, monkeypatch):
    monkeypatch.setenv(STUB_ROOT_ENV, str(tmp_path / "nodes"))
    assert open_launcher("local", {}).root == (tmp_path / "nodes").resolve()


def test_an_ssh_url_names_the_host_to_launch_on():
    launcher = open_launcher("ssh://trainer@gpu-box:2222", {"remote_dir": "/srv/node"})
    assert (launcher.kind, launcher.target.host, launcher.target.connect["port"]) == \
        ("ssh", "gpu-box", 2222)


def test_an_unknown_target_is_refused_with_the_ones_there_are():
    with pytest.raises(ConfigError, match="use skypilot, local or ssh://"):
        open_launcher("kubernetes", {})

"""The entry point's paths on this machine become paths in the code archive."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.resume.entrypoint import relocate

MEMBERS = {"scripts/train.py", "scripts/train_utils.py", "train.py", "configs/a.yaml"}


def test_interpreter_options_and_flag_values_are_relocated_too():
    moved = relocate(["python", "-u", "-W", "error", "/home/me/proj/scripts/train.py",
                      "--config=/home/me/proj/configs/a.yaml"], MEMBERS, "scripts",
                     exists=lambda p: p == "/home/me/proj/scripts")
    assert moved.command == ["python", "-u", "-W", "error", "train.py",
                             "--config=../configs/a.yaml"]
    assert moved.workdir == "scripts"


def test_the_recorded_cwd_picks_the_root_when_two_would_hold_the_script():
    # /home/me/proj/scripts/train.py is "train.py" under .../scripts and
    # "scripts/train.py" under .../proj: only the latter has the recorded cwd in it
    moved = relocate(["python", "/home/me/proj/scripts/train.py"], MEMBERS, "scripts",
                     exists=lambda p: p == "/home/me/proj/scripts")
    assert moved.command == ["python", "train.py"]


def test_a_path_outside_the_archive_stays_with_a_warning():
    moved = relocate(["python", "train.py", "--out", "/data/run"], MEMBERS, ".")
    assert moved.command == ["python", "train.py", "--out", "/data/run"]
    assert moved.warnings and "/data/run" in moved.warnings[0]


def test_python_dash_m_names_no_script_to_check():
    assert relocate(["python", "-m", "pkg.train"], MEMBERS, ".").command == \
        ["python", "-m", "pkg.train"]


@pytest.mark.parametrize("command", [["python", "/elsewhere/run.py"], ["/elsewhere/run.sh"]])
def test_a_script_outside_the_archive_is_refused(command):
    with pytest.raises(ConfigError, match="outside the run's code archive"):
        relocate(command, MEMBERS, ".")


def test_a_script_of_the_same_name_but_other_content_is_refused():
    # /elsewhere/train.py has the archive's name "train.py" but not its bytes
    with pytest.raises(ConfigError, match="differs from the copy in the run's code archive"):
        relocate(["python", "/elsewhere/train.py"], MEMBERS, ".",
                 same=lambda local, member: False)

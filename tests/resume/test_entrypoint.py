"""The entry point's paths on this machine become paths in the code archive, and its
interpreter the node's."""

from __future__ import annotations

import pytest

from burst.errors import ConfigError
from burst.resume.entrypoint import node_program, on_node, relocate
from burst.resume.handoff import travel

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


def test_the_projects_venv_python_named_absolutely_becomes_the_nodes_python():
    moved = relocate(["/home/me/proj/.venv/bin/python", "/home/me/proj/train.py"], MEMBERS, ".")
    assert moved.command == ["python", "train.py"]
    assert not moved.warnings


def test_the_projects_venv_python_named_relatively_becomes_the_nodes_python():
    assert relocate([".venv/bin/python", "train.py"], MEMBERS, ".").command == \
        ["python", "train.py"]


def test_a_versioned_venv_interpreter_running_a_module_becomes_the_nodes_python():
    assert relocate(["venv/bin/python3.11", "-m", "pkg.train"], MEMBERS, ".").command == \
        ["python", "-m", "pkg.train"]


@pytest.mark.parametrize("interpreter", ["/usr/bin/python3", "/opt/conda/envs/lm/bin/python",
                                         "/home/me/.pyenv/shims/python3.11"])
def test_an_interpreter_anywhere_on_this_machine_becomes_the_nodes_python(interpreter):
    assert relocate([interpreter, "/home/me/proj/train.py"], MEMBERS, ".").command == \
        ["python", "train.py"]


def test_a_program_of_a_local_environment_becomes_its_bare_name(tmp_path):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    moved = relocate([str(tmp_path / ".venv" / "bin" / "torchrun"), "/home/me/proj/train.py"],
                     MEMBERS, ".")
    assert moved.command == ["torchrun", "train.py"]


def test_a_program_outside_any_environment_keeps_its_path(tmp_path):
    (tmp_path / "bin").mkdir()
    program = str(tmp_path / "bin" / "torchrun")
    assert node_program([program, "train.py"]) == [program, "train.py"]


def test_a_command_without_a_code_archive_still_gets_the_nodes_python():
    moved = travel(None, "run", None, ["/home/me/proj/.venv/bin/python", "train.py"])
    assert moved.command == ["python", "train.py"]


@pytest.mark.parametrize("name", ["python", "python3", "python3.11"])
def test_on_the_node_a_bare_interpreter_is_the_nodes_by_path(name):
    assert on_node([name, "-u", "train.py"], "/n/venv/bin/python") == \
        ["/n/venv/bin/python", "-u", "train.py"]


def test_on_the_node_another_program_is_left_to_its_path_lookup():
    assert on_node(["torchrun", "train.py"], "/n/venv/bin/python") == ["torchrun", "train.py"]

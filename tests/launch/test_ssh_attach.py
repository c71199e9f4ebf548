"""Re-attaching to a detached SSH job: the resume that started it has gone (a closed
laptop), the job runs on; the ``ssh-job`` event in the run's history says where, and
``burst resume RUN --attach`` tails it to its end and exits with its code. Against a real
OpenSSH server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.launch import Reporter
from burst.launch.ssh import Job, SSHLauncher, Target
from burst.launch.task import parse
from burst.resume import handoff
from burst.store import open_store

# The job waits for a file the test creates once someone is following its log.
TASK = """
name: burst-ssh-attach
resources:
  ordered:
    - {accelerators: "L4:1", infra: ssh/box, use_spot: false}
setup: |
  true
run: |
  echo "waiting"
  while [ ! -f go ]; do sleep 0.05; done
  echo "went on"
  exit 5
"""


def _launcher(sshd, url: str | None = None) -> SSHLauncher:
    target = Target.parse(url or f"ssh://127.0.0.1:{sshd.port}", None, str(sshd.client_key),
                          str(sshd.known_hosts))
    return SSHLauncher(target)


def _start_and_leave(sshd, tmp_path: Path, store) -> Job:
    """What a resume does before its machine goes away: start the job, record where."""
    launcher = SSHLauncher(Target.parse(f"ssh://127.0.0.1:{sshd.port}", None,
                                        str(sshd.client_key), str(sshd.known_hosts)),
                           str(tmp_path / "remote"))
    record = Reporter(say=lambda _m: None,
                      event=lambda name, **f: events.record(store, "run", name, **f))
    job = launcher.start(parse(TASK), {}, record)
    launcher.close()
    return job


def test_attach_follows_a_running_detached_job_to_its_end(sshd, tmp_path):
    store = open_store(str(tmp_path / "store"))
    job = _start_and_leave(sshd, tmp_path, store)
    chunks: list[str] = []

    def output(text: str) -> None:  # the job is still waiting when we are attached
        chunks.append(text)
        if "waiting" in "".join(chunks):
            Path(job.directory, "go").touch()

    result = handoff.attach(store, "run", lambda url: _launcher(sshd, url),
                            Reporter(say=lambda _m: None, output=output))
    assert result.returncode == 5
    assert "".join(chunks).splitlines() == ["waiting", "went on"]
    ends = [e for e in events.read(store, "run") if e["event"] == "launch-end"]
    assert [(e["returncode"], e["attached"]) for e in ends] == [(5, True)]


def test_burst_resume_attach_exits_with_the_jobs_code(sshd, tmp_path):
    store = open_store(str(tmp_path / "store"))
    job = _start_and_leave(sshd, tmp_path, store)
    Path(job.directory, "go").touch()
    status = CliRunner().invoke(main, ["status", "run", "--store", str(tmp_path / "store")])
    assert "burst resume run --attach" in " ".join(status.output.split())
    result = CliRunner().invoke(main, ["resume", "run", "--attach", "--store",
                                       str(tmp_path / "store"), "--identity",
                                       str(sshd.client_key), "--known-hosts",
                                       str(sshd.known_hosts)])
    assert result.exit_code == 5, result.output
    assert "went on" in result.output


def test_attach_without_a_detached_job_is_a_one_line_error(tmp_path):
    store = open_store(str(tmp_path / "store"))
    events.record(store, "run", "launch", to="local")
    result = CliRunner().invoke(main, ["resume", "run", "--attach", "--store",
                                       str(tmp_path / "store")])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no detached job" in lines[0]

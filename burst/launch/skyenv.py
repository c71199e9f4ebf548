"""Where SkyPilot lives: in burst's own interpreter, or in an environment of its own.

skypilot 0.14.1 pins ``click<8.2``; current transformers needs a newer click, so one
environment cannot hold both. The training environment keeps burst and the user's
libraries; SkyPilot is installed beside it (``uv tool install skypilot==0.14.1``, or
``pipx``), and burst calls it across a process boundary (:mod:`burst.launch.skyworker`,
a file that imports nothing of burst). Looked for, in order:

1. ``$BURST_SKYPILOT_PYTHON``: that interpreter (it must import ``sky``);
2. ``sky`` importable here (``pip install 'burst-failover[cloud]'``): called directly;
3. the ``sky`` command on ``PATH``: the interpreter its script starts (``uv tool`` and
   ``pipx`` put one there).

None found: the task cannot be checked by SkyPilot's parser nor launched on a cloud;
``burst resume --to local`` and ``--to ssh://`` run without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burst.errors import BurstError, ConfigError
from burst.launch import skyworker

ENV_PYTHON = "BURST_SKYPILOT_PYTHON"
INSTALL = ("install SkyPilot in its own environment: uv tool install skypilot==0.14.1 "
           f"(or set ${ENV_PYTHON} to an interpreter that has it)")
VALIDATE_TIMEOUT = 120.0  # importing SkyPilot takes seconds; a parse, less


@dataclass(frozen=True)
class SkyPilot:
    """SkyPilot's interpreter; None: this one (``sky`` imports here)."""

    python: str | None = None

    @property
    def where(self) -> str:
        return "this interpreter" if self.python is None else self.python


def find() -> SkyPilot | None:
    """Where SkyPilot is, or None when it is nowhere to be found."""
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ConfigError(f"${ENV_PYTHON}={explicit} is not an executable interpreter")
        return SkyPilot(explicit)
    if importlib.util.find_spec("sky") is not None:
        return SkyPilot(None)
    command = shutil.which("sky")
    python = _script_interpreter(command) if command else None
    return SkyPilot(python) if python else None


def _script_interpreter(script: str) -> str | None:
    """The interpreter a console script's ``#!`` line names (uv tool, pipx, pip)."""
    try:
        with open(script, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:  # #!/usr/bin/env python3
        return shutil.which(words[1])
    return words[0] if "python" in Path(words[0]).name else None


def require() -> SkyPilot:
    found = find()
    if found is None:
        raise ConfigError(f"SkyPilot is not installed: {INSTALL}")
    return found


def validate(text: str, sky: SkyPilot) -> None:
    """SkyPilot's own parser accepts the rendered task, or a one-line ConfigError."""
    if sky.python is None:
        try:
            skyworker.load(text)
        except Exception as exc:  # SkyPilot raises ValueError, jsonschema errors, YAML errors
            raise ConfigError(f"SkyPilot rejects the rendered task: "
                              f"{skyworker.one_line(exc, kind=False)}") from None
        return
    reply = ask(sky, {"op": "validate", "yaml": text})
    if "error" in reply:
        raise ConfigError(f"SkyPilot rejects the rendered task: {reply['error']}")


def describe(text: str, sky: SkyPilot) -> dict[str, Any]:
    """What SkyPilot's parser made of the task (:func:`burst.launch.skyworker.describe`)."""
    if sky.python is None:
        return skyworker.describe(text)
    reply = ask(sky, {"op": "describe", "yaml": text})
    if "error" in reply:
        raise ConfigError(f"SkyPilot rejects the rendered task: {reply['error']}")
    return reply["result"]


class _Worker:
    """One SkyPilot interpreter kept for quick requests (checks), so a process that
    renders many tasks imports SkyPilot once. A reader thread moves its lines into a
    queue, so an answer is waited for with a time limit."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.lock = threading.Lock()
        self.child: subprocess.Popen | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def ask(self, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        with self.lock:
            for _attempt in (1, 2):  # a worker that died is started again, once
                if self.child is None or self.child.poll() is not None:
                    self._start()
                try:
                    assert self.child is not None and self.child.stdin is not None
                    self.child.stdin.write(json.dumps(request) + "\n")
                    self.child.stdin.flush()
                    reply = self._answer(timeout)
                except OSError:
                    reply = None
                if reply is not None:
                    return reply
                self._stop()
            raise BurstError(f"SkyPilot's interpreter {self.python} gave no answer")

    def _start(self) -> None:
        self.child = _start(self.python)
        self.lines = queue.Queue()
        threading.Thread(target=_pump, args=(self.child.stdout, self.lines), daemon=True,
                         name="burst-skypilot").start()

    def _stop(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
        self.child = None

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        """The next reply line (SkyPilot's own output skipped), within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                return None
            if line is None:  # the worker exited
                return None
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and ("result" in message or "error" in message):
                return message


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


_workers: dict[str, _Worker] = {}
_workers_lock = threading.Lock()


def ask(sky: SkyPilot, request: Mapping[str, Any],
        timeout: float = VALIDATE_TIMEOUT) -> dict[str, Any]:
    """A quick request (no streaming) to the kept SkyPilot worker for ``sky``."""
    assert sky.python is not None
    with _workers_lock:
        worker = _workers.setdefault(sky.python, _Worker(sky.python))
    reply = worker.ask(request, timeout)
    if reply.get("missing"):
        raise ConfigError(f"{sky.python} has no SkyPilot: {INSTALL}")
    return reply


def _start(python: str, stderr: int | None = subprocess.DEVNULL) -> subprocess.Popen:
    """SkyPilot's interpreter running the worker (``stderr`` None: the terminal's)."""
    try:
        return subprocess.Popen([python, skyworker.__file__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=_child_env(), start_new_session=stderr is not None)
    except OSError as exc:
        raise ConfigError(f"cannot start SkyPilot's interpreter {python}: "
                          f"{exc.strerror or exc}") from None


def call(sky: SkyPilot, request: Mapping[str, Any], *,
         event: Callable[..., None] | None = None, say: Callable[[str], None] | None = None,
         output: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Run one long request (a launch) in a fresh SkyPilot interpreter; relay its events,
    its lines and SkyPilot's own output (the job's logs) as they come; return its last
    line (``{"result": ...}`` or ``{"error": ...}``)."""
    assert sky.python is not None
    child = _start(sky.python, stderr=None)
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(request) + "\n")
        child.stdin.close()
        final = _relay(child.stdout, event, say, output)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if final is None:
        raise BurstError(f"SkyPilot's interpreter {sky.python} exited {child.returncode} "
                         "without an answer")
    if final.get("missing"):
        raise ConfigError(f"{sky.python} has no SkyPilot: {INSTALL}")
    return final


def _relay(lines: Any, event: Callable[..., None] | None, say: Callable[[str], None] | None,
           output: Callable[[str], object] | None) -> dict[str, Any] | None:
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            if output is not None:
                output(line)  # SkyPilot's own: the job's logs
            continue
        if "event" in message and event is not None:
            event(str(message["event"]), **(message.get("fields") or {}))
        elif "say" in message and say is not None:
            say(str(message["say"]))
        elif "result" in message or "error" in message:
            return message
    return None


def _child_env() -> dict[str, str]:
    """SkyPilot's interpreter gets this environment without burst's own Python path
    settings: it is another environment, with its own site-packages."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def interpreter() -> str:
    """The interpreter that imports SkyPilot (for probes run in a child), this one's if
    none is found (the probe then says it is not installed)."""
    found = find()
    if found is None or found.python is None:
        return sys.executable
    return found.python

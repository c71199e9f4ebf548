"""Does SkyPilot see an enabled cloud or Kubernetes context?

Asked the way ``sky check`` asks (SkyPilot's own credential checks, which also refresh its
cache of enabled clouds), in a child process with a time limit: SkyPilot takes seconds to
import and a check can wait on a network that is not there, and the preflight must answer
anyway. Offline (``--offline`` or ``$BURST_OFFLINE``) only SkyPilot's cache of the last
``sky check`` is read, which needs no network. An answer that did not come from a check
just made (the cache, a timeout, an error) is ``unknown``, never a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

from burst.preflight.table import FAIL, OK, UNKNOWN, Row

NAME = "skypilot clouds"
DEFAULT_TIMEOUT = 60.0
FIX = "run `sky check` to see which credentials are missing, and set up one cloud or a " \
      "Kubernetes context (or burst with --to ssh://...)"

# Runs in a child: prints one JSON line, the enabled clouds for compute (live: a real
# check; cache: what the last check stored). SkyPilot may print; the last line is ours.
_PROBE = r"""
import json, sys
try:
    from sky.clouds import cloud as sky_cloud
except ImportError:
    print(json.dumps({"installed": False})); raise SystemExit(0)
compute = sky_cloud.CloudCapability.COMPUTE
if sys.argv[1] == "live":
    from sky import check
    try:
        found = check.check_capability(compute, quiet=True)
    except SystemExit:
        found = {}
    clouds = sorted({str(c) for names in found.values() for c in names})
else:
    from sky import global_user_state, skypilot_config
    workspace = skypilot_config.get_active_workspace()
    clouds = sorted(str(c) for c in global_user_state.get_cached_enabled_clouds(compute,
                                                                               workspace))
print(json.dumps({"installed": True, "clouds": clouds}))
"""


def clouds_row(*, offline: bool, timeout: float = DEFAULT_TIMEOUT, required: bool = True,
               python: str | None = None) -> Row:
    """The SkyPilot row; ``python`` is the interpreter SkyPilot is installed in (default:
    wherever burst finds it, :mod:`burst.launch.skyenv`)."""
    from burst.launch import skyenv  # here: the launch package renders tasks (jinja2)

    mode = "cache" if offline else "live"
    answer, problem = _ask(python or skyenv.interpreter(), mode, timeout)
    if answer is None:
        return Row(NAME, UNKNOWN, problem, FIX, required)
    if not answer.get("installed"):
        return Row(NAME, UNKNOWN, "SkyPilot is not installed here",
                   f"{skyenv.INSTALL} (or burst with --to ssh://...)",
                   required)
    clouds = answer.get("clouds") or []
    if offline:
        seen = ", ".join(clouds) if clouds else "none"
        return Row(NAME, UNKNOWN, f"offline: not checked; the last `sky check` enabled: {seen}",
                   "run `burst check` online (without --offline) to ask SkyPilot", required)
    if not clouds:
        return Row(NAME, FAIL, "`sky check` enables no cloud or Kubernetes context", FIX,
                   required)
    return Row(NAME, OK, f"enabled: {', '.join(clouds)}", required=required)


def _ask(python: str, mode: str, timeout: float) -> tuple[dict | None, str]:
    """Run the probe; (answer, "") or (None, why there is none)."""
    try:
        child = subprocess.Popen([python, "-c", _PROBE, mode], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
    except OSError as error:
        return None, f"cannot start {python}: {error.strerror or error}"
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(child)
        return None, f"SkyPilot did not answer within {timeout:g}s (offline?)"
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if child.returncode != 0 or not isinstance(answer, dict):
        tail = (err.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"SkyPilot's check failed: {tail}"
    return answer, ""


def _kill(child: subprocess.Popen) -> None:
    """End the probe and anything it started (its own session, so the whole group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.communicate()

"""Run burst's SkyPilot worker with the SDK's cloud calls replaced by recorders, inside
SkyPilot's own interpreter: what they receive is the real ``sky.Task`` with real
``sky.Resources``, written as plain values to ``$BURST_TEST_SKY_RECORD`` (JSON lines).

``python sky_recorder.py WORKER`` (what the wrapper interpreter of
tests/resume/test_launch_skypilot.py runs). ``$BURST_TEST_SKY_FAIL`` makes
``sky.jobs.launch`` raise SkyPilot's own ResourcesUnavailableError;
``$BURST_TEST_SKY_LANDED`` (an ``infra`` such as ``k8s/bj-a100``) makes ``sky.launch``'s
handle say the cluster came up there (``launched_resources``, a real ``sky.Resources``)."""

import json
import os
import runpy
import sys
from types import SimpleNamespace

import sky

RECORD = os.environ["BURST_TEST_SKY_RECORD"]
LANDED = os.environ.get("BURST_TEST_SKY_LANDED")
HANDLE = SimpleNamespace(launched_resources=sky.Resources(infra=LANDED)) if LANDED else None
RESULTS = {"req-jobs": ([42], None), "req-launch": (3, HANDLE), "req-down": None,
           "req-autostop": None}


def view(value):
    if isinstance(value, sky.Task):
        return {"type": "sky.Task", "envs": dict(value.envs), "setup": value.setup,
                "run": value.run, "secrets": {k: v.get_secret_value()
                                              for k, v in value.secrets.items()},
                "managed_secret_refs": bool(value.managed_secret_refs),
                "resources_type": type(value.resources).__name__,
                "resources": [{"type": type(r).__name__, "accelerators": r.accelerators,
                               "use_spot": r.use_spot, "cloud": r.cloud and str(r.cloud),
                               "region": r.region, "job_recovery": r.job_recovery}
                              for r in value.resources]}
    return value


def recorder(name, result):
    def call(*args, **kwargs):
        if name == "jobs.launch" and os.environ.get("BURST_TEST_SKY_FAIL"):
            raise sky.exceptions.ResourcesUnavailableError("no capacity anywhere\ndetails...")
        with open(RECORD, "a") as out:
            out.write(json.dumps({"name": name, "args": [view(a) for a in args],
                                  "kwargs": {k: view(v) for k, v in kwargs.items()}}) + "\n")
        return RESULTS[args[0]] if name == "stream_and_get" else result
    return call


sky.jobs.launch = recorder("jobs.launch", "req-jobs")
sky.jobs.tail_logs = recorder("jobs.tail_logs", 0)
sky.launch = recorder("launch", "req-launch")
sky.tail_logs = recorder("tail_logs", 0)
sky.down = recorder("down", "req-down")
sky.autostop = recorder("autostop", "req-autostop")
sky.stream_and_get = recorder("stream_and_get", None)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

"""Every call burst makes into SkyPilot's SDK, in a file that imports nothing of burst.

SkyPilot pins its dependencies hard (skypilot 0.14.1: ``click<8.2``, which current
transformers cannot live with), so burst does not make the training environment hold it.
SkyPilot may live in its own environment (``uv tool install skypilot==0.14.1``): burst
runs this file with that environment's interpreter (:mod:`burst.launch.skyenv`) and
talks to it in JSON lines: one request on stdin, then ``{"event": ...}`` and ``{"say":
...}`` lines while it works and one ``{"result": ...}`` or ``{"error": ...}`` line at the
end. Where SkyPilot is importable in burst's own interpreter the same functions are
called directly. Secret values travel on stdin only, never in a file or an argument.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

Event = Callable[..., None]  # event(name, **fields): a launch event for the run's history
Say = Callable[[str], None]
CANNOT_STOP = ("kubernetes", "ssh")  # str(cloud) of a launched cluster, lower case


def load(text: str, secrets: Mapping[str, str] | None = None) -> Any:
    """The ``sky.Task`` for the rendered YAML (SkyPilot's own parser, offline). Secret
    values fill the null-valued names at load time, so they live only in the task."""
    import sky
    import yaml

    if secrets:
        return sky.Task.from_yaml_config(yaml.safe_load(text),
                                         secrets_overrides=list(secrets.items()))
    return sky.Task.from_yaml_str(text)


def managed_job(text: str, secrets: Mapping[str, str], name: str, event: Event,
                say: Say) -> dict[str, Any]:
    """``sky.jobs.launch`` and follow its logs; the launcher's code (0 or 100) and id."""
    import sky

    request = sky.jobs.launch(load(text, secrets), name=name)
    job_ids, _controller = sky.stream_and_get(request)
    job_id = job_ids[0] if job_ids else None
    event("skypilot-job", name=name, job_id=job_id)
    say(f"managed job {name} (id {job_id}) launched; following its logs "
        "(Ctrl-C stops following, not the job)")
    code = sky.jobs.tail_logs(job_id=job_id, follow=True)
    return {"code": int(code or 0), "handle": f"skypilot-job:{name}:{job_id}",
            "details": {"job_id": job_id}}


def on_cluster(text: str, secrets: Mapping[str, str], cluster: str, idle_minutes: int,
               keep: bool, event: Event, say: Say, own_capacity: bool = False
               ) -> dict[str, Any]:
    """``sky.launch`` on a named cluster with autostop, follow, then ``sky.down`` it
    unless ``keep``. ``own_capacity`` (a kept cluster whose candidates include a
    Kubernetes context or an SSH pool, where SkyPilot refuses autostop and would drop the
    candidate): launch with no idle timer, then set it only where the cluster landed on a
    cloud that can stop."""
    import sky

    request = sky.launch(load(text, secrets), cluster_name=cluster,
                         idle_minutes_to_autostop=None if own_capacity else idle_minutes,
                         down=not keep)
    job_id, handle = sky.stream_and_get(request)
    stops = True
    if own_capacity:
        stops = autostop_where_it_can(cluster, handle, idle_minutes, say)
    event("skypilot-cluster", cluster=cluster, job_id=job_id)
    say(f"cluster {cluster}: job {job_id} running; following its logs")
    code = sky.tail_logs(cluster, job_id, follow=True)
    if keep:
        when = "it stops when idle; " if stops else ""
        say(f"keeping {cluster} (--keep): {when}sky down {cluster} when done with it")
    else:
        say(f"tearing down {cluster}")
        sky.stream_and_get(sky.down(cluster))
    return {"code": int(code or 0), "handle": f"skypilot-cluster:{cluster}",
            "details": {"job_id": job_id, "kept": keep,
                        "autostop": idle_minutes if stops else None}}


def autostop_where_it_can(cluster: str, handle: Any, idle_minutes: int, say: Say) -> bool:
    """After a kept launch with no idle timer: ``sky.autostop`` where the cluster landed
    on a cloud that can stop; on own capacity say that it stays up. Whether it stops."""
    import sky

    resources = getattr(handle, "launched_resources", None)
    cloud = str(getattr(resources, "cloud", "") or "")
    if not cloud or cloud.lower() in CANNOT_STOP:
        say(f"{cluster} runs on own capacity ({cloud or 'Kubernetes or an SSH pool'}), "
            f"which SkyPilot cannot stop: no autostop, it stays up until sky down {cluster}")
        return False
    sky.stream_and_get(sky.autostop(cluster, idle_minutes, down=False))
    say(f"{cluster} landed on {cloud}: it stops after {idle_minutes} idle minutes (--keep)")
    return True


def one_line(exc: BaseException, kind: bool = True) -> str:
    """The exception's first line (after its type, with ``kind``)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    first = text.splitlines()[0]
    return f"{type(exc).__name__}: {first}" if kind else first


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def serve(request: Mapping[str, Any]) -> dict[str, Any]:
    """One request: ``validate``, ``job`` or ``cluster``; the result's fields."""
    op = request.get("op")

    def event(kind: str, /, **fields: Any) -> None:
        _emit({"event": kind, "fields": fields})

    def say(text: str) -> None:
        _emit({"say": text})

    if op == "validate":
        load(request["yaml"])
        return {}
    secrets = request.get("secrets") or {}
    if op == "job":
        return managed_job(request["yaml"], secrets, request["name"], event, say)
    if op == "cluster":
        return on_cluster(request["yaml"], secrets, request["cluster"],
                          int(request["idle_minutes"]), bool(request["keep"]), event, say,
                          own_capacity=bool(request.get("own_capacity")))
    raise ValueError(f"unknown request {op!r}")


def describe(text: str) -> dict[str, Any]:
    """What SkyPilot made of the task: its nodes, envs, commands and resources in order."""
    task = load(text)
    resources = []
    for r in task.resources:
        infra = getattr(r, "infra", None)
        resources.append({
            "accelerators": r.accelerators, "use_spot": r.use_spot,
            "infra": None if infra is None else (infra.to_str() if hasattr(infra, "to_str")
                                                 else str(infra)),
            "cloud": None if r.cloud is None else str(r.cloud),
            "image_id": r.image_id, "job_recovery": r.job_recovery})
    return {"name": task.name, "num_nodes": task.num_nodes, "setup": task.setup,
            "run": task.run, "envs": dict(task.envs), "resources": resources}


def main() -> None:
    """Serve requests, one JSON line each, until stdin closes."""
    try:
        import sky  # noqa: F401
    except ImportError:
        _emit({"error": "SkyPilot is not installed in this interpreter", "missing": True})
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            if request.get("op") == "describe":
                _emit({"result": describe(request["yaml"])})
            else:
                _emit({"result": serve(request)})
        except Exception as exc:  # SkyPilot raises ValueError, jsonschema and YAML errors
            _emit({"error": one_line(exc, kind=request.get("op") not in ("validate", "describe"))})


if __name__ == "__main__":
    main()

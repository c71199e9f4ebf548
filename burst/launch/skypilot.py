"""The ``skypilot`` launcher: the real SDK (skypilot 0.14.1).

Two modes. ``jobs`` (the default): a managed job, ``sky.jobs.launch``; SkyPilot walks the
ordered candidates, and on preemption or a recoverable exit code (the task's
``job_recovery``) brings the job up again elsewhere with the same ``SKYPILOT_TASK_ID``, so
the node side simply resumes from the newest snapshot; the controller tears the node down
when the job ends. ``cluster``: ``sky.launch`` on a named cluster with autostop, for when a
person wants to log in. It has no recovery, so its task never holds a spot candidate
(:func:`burst.launch.task.render` refuses one). Without ``keep`` the cluster is torn down
when the run ends (and autodown after the idle time, should burst be gone by then); with
``keep`` it stays: no ``sky.down``, and the idle timer only stops it (``down=False``), so
``sky start`` brings it back with its disks. Own capacity (Kubernetes contexts, SSH pools)
cannot be stopped: SkyPilot refuses autostop there (``AUTOSTOP`` is an unsupported feature
of its Kubernetes cloud, which SSH pools inherit) and would drop those candidates, so a kept
cluster whose task holds own capacity launches with no idle timer, and gets its autostop
afterwards (``sky.autostop``) only if it landed on a cloud that can stop.

The managed job's exit code is not the job's own: ``sky.jobs.tail_logs`` returns 0 or 100
(success or not), so ``burst resume`` reads the job's meaning (86, 87, 88, 0) from the
nodes' events in the store (:func:`burst.resume.status.job_exit_code`).

Requests are asynchronous in the 0.14 SDK: each call returns a request id and
``sky.stream_and_get`` streams its log and returns its result. Secret values are handed to
``sky.Task.from_yaml_config`` as ``secrets_overrides``: they live in the ``sky.Task`` (which
redacts them) and never in the YAML.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from burst.errors import BurstError, ConfigError
from burst.launch import LaunchResult, Reporter
from burst.launch.task import RenderedTask, validate

MODES = ("jobs", "cluster")
OWN_CAPACITY = ("k8s/", "kubernetes/", "ssh/")  # infra prefixes SkyPilot cannot stop
CANNOT_STOP = ("kubernetes", "ssh")  # str(cloud) of a launched cluster, lower case


@dataclass
class SkyPilotLauncher:
    mode: str = "jobs"
    cluster: str | None = None  # cluster mode: its name (default: the task's)
    idle_minutes: int = 10  # cluster mode: autostop (and autodown) after this idle time
    keep: bool = False  # cluster mode: leave the cluster up when the run ends
    kind: str = "skypilot"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"SkyPilot mode must be one of {', '.join(MODES)}, "
                              f"got {self.mode!r}")

    def describe(self, task: RenderedTask, secret_names: list[str]) -> list[str]:
        secrets = "".join(f" --secret {name}" for name in secret_names)
        if self.mode == "jobs":
            return [f"sky jobs launch -n {shlex.quote(task.name)}{secrets} task.yaml  "
                    "# sky.jobs.launch(task, name=...) then sky.stream_and_get(request)",
                    f"sky jobs logs -n {shlex.quote(task.name)} --follow  "
                    "# sky.jobs.tail_logs(job_id=..., follow=True)"]
        cluster = shlex.quote(self._cluster(task))
        down = "" if self.keep else " --down"
        idle = "" if self._keeps_own_capacity(task) else f" -i {self.idle_minutes}"
        lines = [f"sky launch -c {cluster}{idle}{down}{secrets} task.yaml  "
                 "# sky.launch(task, cluster_name=..., idle_minutes_to_autostop=..., "
                 f"down={not self.keep})",
                 f"sky logs {cluster} JOB_ID --follow  # sky.tail_logs(cluster, job_id, "
                 "follow=True)"]
        if self._keeps_own_capacity(task):
            lines.append(f"sky autostop {cluster} -i {self.idle_minutes}  # only if it landed "
                         "on a cloud that can stop: own capacity (Kubernetes, SSH pools) "
                         "cannot")
        if self.keep:
            lines.append(f"# --keep: {cluster} stays (stopped when idle); sky down {cluster} "
                         "when done with it")
        else:
            lines.append(f"sky down {cluster}  # sky.down(cluster) when the run ends")
        return lines

    def launch(self, task: RenderedTask, secrets: Mapping[str, str],
               report: Reporter) -> LaunchResult:
        sky_task = validate(task.yaml, secrets)
        try:
            if self.mode == "jobs":
                return self._managed_job(sky_task, task, report)
            return self._on_cluster(sky_task, task, report)
        except BurstError:
            raise
        except Exception as exc:  # the SDK's own errors: capacity, credentials, API server
            raise BurstError(f"SkyPilot: {_one_line(exc)}") from None

    def _cluster(self, task: RenderedTask) -> str:
        return self.cluster or task.name

    def _managed_job(self, sky_task: Any, task: RenderedTask, report: Reporter
                     ) -> LaunchResult:
        import sky

        request = sky.jobs.launch(sky_task, name=task.name)
        job_ids, _controller = sky.stream_and_get(request)
        job_id = job_ids[0] if job_ids else None
        report.event("skypilot-job", name=task.name, job_id=job_id)
        report.say(f"managed job {task.name} (id {job_id}) launched; following its logs "
                   "(Ctrl-C stops following, not the job)")
        code = sky.jobs.tail_logs(job_id=job_id, follow=True)
        return LaunchResult(int(code or 0), f"skypilot-job:{task.name}:{job_id}",
                            {"job_id": job_id})

    def _keeps_own_capacity(self, task: RenderedTask) -> bool:
        """A kept cluster that may land on capacity SkyPilot cannot stop."""
        return self.keep and any(str(c.get("infra") or "").lower().startswith(OWN_CAPACITY)
                                 for c in task.candidates)

    def _on_cluster(self, sky_task: Any, task: RenderedTask, report: Reporter) -> LaunchResult:
        import sky

        cluster = self._cluster(task)
        own = self._keeps_own_capacity(task)
        request = sky.launch(sky_task, cluster_name=cluster,
                             idle_minutes_to_autostop=None if own else self.idle_minutes,
                             down=not self.keep)
        job_id, handle = sky.stream_and_get(request)
        if own:
            self._autostop_where_it_can(cluster, handle, report)
        report.event("skypilot-cluster", cluster=cluster, job_id=job_id)
        report.say(f"cluster {cluster}: job {job_id} running; following its logs")
        code = sky.tail_logs(cluster, job_id, follow=True)
        if self.keep:
            report.say(f"keeping {cluster} (--keep): it stops when idle; sky down {cluster} "
                       "when done with it")
        else:
            report.say(f"tearing down {cluster}")
            sky.stream_and_get(sky.down(cluster))
        return LaunchResult(int(code or 0), f"skypilot-cluster:{cluster}",
                            {"job_id": job_id, "kept": self.keep})


    def _autostop_where_it_can(self, cluster: str, handle: Any, report: Reporter) -> None:
        """After a kept launch with no idle timer: stop when idle where the cluster landed
        on a cloud that can stop; on own capacity say that it stays up."""
        import sky

        resources = getattr(handle, "launched_resources", None)
        cloud = str(getattr(resources, "cloud", "") or "")
        if not cloud or cloud.lower() in CANNOT_STOP:
            report.say(f"{cluster} runs on own capacity ({cloud or 'Kubernetes or an SSH pool'}),"
                       " which SkyPilot cannot stop: no autostop, it stays up until "
                       f"sky down {cluster}")
            return
        sky.stream_and_get(sky.autostop(cluster, self.idle_minutes, down=False))
        report.say(f"{cluster} landed on {cloud}: it stops after {self.idle_minutes} idle "
                   "minutes (--keep)")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__

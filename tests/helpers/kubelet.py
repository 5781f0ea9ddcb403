"""A test "kubelet" (and batch Job / Deployment controller) that drives child objects through the API.

It writes pod status exactly as a kubelet would report it (phase, conditions, container statuses with
exit codes, reasons and termination messages) through the status subresource, so the operator sees
the changes through its watches.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from trex_operator.kube import Kube


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    """Moves pods between phases; also completes batch Jobs and makes Deployments available."""

    def __init__(self, kube: Kube, namespace: str = "default") -> None:
        self.kube = kube
        self.namespace = namespace

    async def _status(self, pod: str, status: dict[str, Any]) -> None:
        await self.kube.patch("v1", "Pod", self.namespace, pod, {"status": status}, subresource="status")

    async def schedule(self, pod: str, node: str, annotations: dict[str, str] | None = None,
                       pod_ip: str = "10.0.0.1") -> None:
        """Bind the pod to ``node`` (plus device-plugin annotations) and report it Pending on the node."""
        body: dict[str, Any] = {"spec": {"nodeName": node}}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        await self.kube.patch("v1", "Pod", self.namespace, pod, body)
        await self._status(pod, {"phase": "Pending", "hostIP": "192.168.0.1", "podIP": pod_ip,
                                 "conditions": [{"type": "PodScheduled", "status": "True"}]})

    async def run(self, pod: str, pod_ip: str = "10.0.0.1") -> None:
        """Container started: phase Running."""
        await self._status(pod, {
            "phase": "Running", "podIP": pod_ip, "startTime": _now(),
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "trex", "ready": True, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"running": {"startedAt": _now()}}}],
        })

    async def terminate(self, pod: str, exit_code: int, reason: str | None = None,
                        summary: dict[str, Any] | None = None, message: str | None = None) -> None:
        """Container exited: Succeeded on exit code 0, else Failed; ``summary`` becomes the termination message."""
        term: dict[str, Any] = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                                "startedAt": _now(), "finishedAt": _now()}
        if summary is not None:
            term["message"] = json.dumps(summary)
        elif message is not None:
            term["message"] = message
        await self._status(pod, {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "trex", "ready": False, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"terminated": term}}],
        })

    async def evict(self, pod: str) -> None:
        """Node-pressure eviction by the kubelet."""
        await self._status(pod, {"phase": "Failed", "reason": "Evicted",
                                 "message": "The node was low on resource: memory."})

    async def preempt(self, pod: str) -> None:
        """Preemption by the scheduler: DisruptionTarget condition, then the pod fails."""
        await self._status(pod, {
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                            "message": "Preempted in order to admit critical pod"}],
            "containerStatuses": [{"name": "trex", "ready": False, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        })

    async def image_pull_error(self, pod: str) -> None:
        """The image cannot be pulled: the pod stays Pending with ImagePullBackOff."""
        await self._status(pod, {
            "phase": "Pending",
            "containerStatuses": [{"name": "trex", "ready": False, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"waiting": {"reason": "ImagePullBackOff",
                                                         "message": "Back-off pulling image \"nope\""}}}],
        })

    # ---- controllers the emulator lacks -----------------------------------------------------------

    async def job_progress(self, name: str, succeeded: int, active: int) -> None:
        """batch Job status while running."""
        await self.kube.patch("batch/v1", "Job", self.namespace, name,
                              {"status": {"succeeded": succeeded, "active": active, "startTime": _now()}},
                              subresource="status")

    async def job_finish(self, name: str, ok: bool, succeeded: int = 1) -> None:
        """batch Job reached Complete (or Failed)."""
        cond = {"type": "Complete" if ok else "Failed", "status": "True", "lastTransitionTime": _now()}
        await self.kube.patch("batch/v1", "Job", self.namespace, name,
                              {"status": {"succeeded": succeeded if ok else 0, "failed": 0 if ok else 1, "active": 0,
                                          "conditions": [cond]}}, subresource="status")

    async def job_pod(self, job: dict[str, Any], pod_name: str, exit_code: int,
                      summary: dict[str, Any] | None = None) -> None:
        """Create a finished pod from a batch Job's template (as the Job controller + kubelet would)."""
        template = job["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": self.namespace,
                            "labels": dict(template["metadata"].get("labels", {}))},
               "spec": template["spec"]}
        await self.kube.create(pod)
        await self.terminate(pod_name, exit_code, summary=summary)

    async def deployment_available(self, name: str) -> None:
        """Deployment has one available replica."""
        await self.kube.patch("apps/v1", "Deployment", self.namespace, name,
                              {"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}},
                              subresource="status")

"""HCCL rank table (hccl.json) and the MindCluster pod contract of Ascend jobs, as pure functions.

Formats and rules (published by Huawei in the MindCluster sources: ascend-device-plugin, ascend-operator,
ascend-for-volcano; and CANN's "rank table configuration file"):

- The Ascend device plugin annotates each pod it allocates NPUs to with a JSON "Instance"
  ``{"pod_name", "server_id", "host_ip", "super_pod_id", "devices": [{"device_id", "device_ip",
  "super_device_id"?}]}`` under ``ascend.kubectl.kubernetes.io/ascend-910-configuration`` (resource
  ``huawei.com/Ascend910``) or ``ascend.kubectl.kubernetes.io/ascend-npu-configuration`` (the unified
  resource ``huawei.com/npu``). A ``device_ip`` of ``"-1"`` means the device's NIC has no address.
- The rank table: ``{"status": "initializing" | "completed", "version": "1.0" | "1.2", "server_count",
  "server_list": [{"server_id", "host_ip", "container_ip", "device": [{"device_id", "device_ip",
  "super_device_id"? , "rank_id"}]}], "super_pod_list"?}``; every number is a string.
  ``rank_id = rankIndex x devices + i`` where rankIndex is the pod's ``hccl/rankIndex`` annotation.
- Version 1.2 (super_device_id per device, super_pod_list by *logical* super-pod ID) only for super-pod
  jobs: a ``huawei.com/schedule_policy`` of chip2-node16-sp, chip2-node8-sp or multilevel, an
  ``sp-block`` annotation, or a nodeSelector ``accelerator-type`` of module-a3-16-super-pod /
  module-a3-8-super-pod. Every other job, an ordinary Atlas A3 server included, gets 1.0.
- Logical super-pod of pod rank r: ``r // max(1, spBlock // devicesPerPod)`` (0 without sp-block); the
  pods also get it as HCCL_LOGIC_SUPERPOD_ID.
- Device IPs must be set for 1.0, and for 1.2 when the job spans several logical super-pods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from trex_operator.api import CommonSpec
    from trex_operator.defaults import ClusterDefaults

ANNOTATIONS = ("ascend.kubectl.kubernetes.io/ascend-910-configuration",
               "ascend.kubectl.kubernetes.io/ascend-npu-configuration")
"""The device plugin's per-pod device annotation: for huawei.com/Ascend910, then for huawei.com/npu."""
ANNOTATION = ANNOTATIONS[0]
RANK_INDEX_ANNOTATION = "hccl/rankIndex"
"""The pod's rank among the job's pods (read by the rank-table writer and Volcano's huawei-npu plugin)."""
SP_BLOCK_ANNOTATION = "sp-block"
"""Devices per logical super-pod (a job annotation; Volcano and ascend-operator read it)."""
SCHEDULE_POLICY_ANNOTATION = "huawei.com/schedule_policy"
JOB_ANNOTATIONS = (SP_BLOCK_ANNOTATION, SCHEDULE_POLICY_ANNOTATION)
"""MindCluster job annotations copied from the trex job onto its PodGroup and pods."""
SUPER_POD_POLICIES = ("chip2-node16-sp", "chip2-node8-sp", "multilevel")
UNIFIED_RESOURCE = "huawei.com/npu"
"""The device plugin's unified NPU resource (its pods carry the ascend-npu-configuration annotation)."""
ACCELERATOR_TYPE_LABEL = "accelerator-type"
"""MindCluster node label naming the server type, e.g. module-910b-8 (A2) or module-a3-16-super-pod (A3)."""
SUPER_POD_ACCELERATOR_TYPES = ("module-a3-16-super-pod", "module-a3-8-super-pod")
NO_DEVICE_IP = ("-1", "")
"""device_ip values meaning the device's NIC is not configured."""
RANK_TABLE_KEY = "hccl.json"
Version = Literal["1.0", "1.2"]


class RankTableError(ValueError):
    """An annotation that cannot be turned into a rank table (message names the pod)."""


class DeviceIPError(RankTableError):
    """A device without an IP where the table version needs one: HCCL would fail; nothing will fix it by waiting."""


class LayoutError(ValueError):
    """A job annotation that does not describe a valid super-pod layout (message names the annotation)."""


def initializing() -> dict[str, Any]:
    """The table before every pod has its devices: HCCL must not start yet."""
    return {"status": "initializing"}


@dataclass(frozen=True)
class Layout:
    """How a job's table is shaped: its version and the logical super-pod size (devices, 0 = one super-pod)."""

    version: Version
    sp_block: int
    devices_per_pod: int
    pods: int

    def logical_super_pod(self, pod_rank: int) -> int:
        """Logical super-pod ID of the pod with rank ``pod_rank`` (HCCL_LOGIC_SUPERPOD_ID)."""
        if self.sp_block <= 0 or self.devices_per_pod <= 0:
            return 0
        return pod_rank // max(1, self.sp_block // self.devices_per_pod)

    @property
    def needs_device_ip(self) -> bool:
        """1.0 always; 1.2 only when the job spans more than one logical super-pod."""
        if self.version == "1.0":
            return True
        return self.sp_block > 0 and self.pods * self.devices_per_pod // self.sp_block > 1


def layout(job_annotations: dict[str, str], node_selector: dict[str, str], devices_per_pod: int,
           pods: int) -> Layout:
    """The job's rank-table layout from its annotations and its pods' nodeSelector (MindCluster's rules)."""
    raw = job_annotations.get(SP_BLOCK_ANNOTATION)
    sp_block = 0
    if raw is not None:
        try:
            sp_block = int(raw)
        except ValueError:
            raise LayoutError(f"metadata.annotations[{SP_BLOCK_ANNOTATION}]: {raw!r} is not an integer") from None
        total = pods * devices_per_pod
        if sp_block <= 0 or sp_block % devices_per_pod or total % sp_block:
            raise LayoutError(f"metadata.annotations[{SP_BLOCK_ANNOTATION}]: {sp_block} must be a positive multiple "
                              f"of devicesPerReplica={devices_per_pod} that divides the job's {total} devices")
    policy = job_annotations.get(SCHEDULE_POLICY_ANNOTATION)
    if policy is not None:
        super_pod = policy in SUPER_POD_POLICIES
    else:
        super_pod = raw is not None or node_selector.get(ACCELERATOR_TYPE_LABEL) in SUPER_POD_ACCELERATOR_TYPES
    return Layout("1.2" if super_pod else "1.0", sp_block, devices_per_pod, pods)


def _instance(pod: dict[str, Any]) -> dict[str, Any] | None:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    key = next((k for k in ANNOTATIONS if annotations.get(k)), None)
    if key is None:
        return None
    try:
        inst = json.loads(annotations[key])
    except (TypeError, ValueError) as exc:
        raise RankTableError(f"pod {meta.get('name')}: annotation {key} is not JSON: {exc}") from None
    if not isinstance(inst, dict) or not isinstance(inst.get("devices"), list):
        raise RankTableError(f"pod {meta.get('name')}: annotation {key} has no 'devices' list")
    return inst


def _device_key(d: Any) -> int:
    try:
        return int(d["device_id"])
    except (KeyError, TypeError, ValueError):
        raise RankTableError(f"device entry {d!r} has no integer device_id") from None


def _ready(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and bool((pod.get("status") or {}).get("podIP"))


def render(pods_by_rank: list[dict[str, Any]], shape: Layout) -> dict[str, Any]:
    """The rank table for pods ordered by pod rank; ``initializing`` until every pod is annotated, bound and
    has its IP. RankTableError (DeviceIPError for a missing device IP) names the pod and device.

    Devices are ordered by device_id, so rank i of a pod is the pod's i-th visible NPU (LOCAL_RANK i).
    """
    instances: list[dict[str, Any]] = []
    for p in pods_by_rank:
        inst = _instance(p)
        if inst is None or not _ready(p):
            return initializing()
        name = (p.get("metadata") or {}).get("name")
        if len(inst["devices"]) != shape.devices_per_pod:
            raise RankTableError(f"pod {name}: the device plugin assigned {len(inst['devices'])} devices, "
                                 f"expected devicesPerReplica={shape.devices_per_pod}")
        if shape.needs_device_ip:
            for d in inst["devices"]:
                if str(d.get("device_ip", "")) in NO_DEVICE_IP:
                    node = (p.get("spec") or {}).get("nodeName")
                    raise DeviceIPError(f"pod {name} on node {node}: NPU {d.get('device_id')} has no device IP "
                                        f"(device_ip {d.get('device_ip', '')!r}); configure the NPU NICs (hccn_tool) "
                                        f"on that node: rank table version {shape.version} needs every device IP")
        instances.append(inst)
    super_pod = shape.version == "1.2"
    servers: list[dict[str, Any]] = []
    super_pods: list[dict[str, Any]] = []
    for rank, (p, inst) in enumerate(zip(pods_by_rank, instances, strict=True)):
        status = p.get("status") or {}
        server_id = str(inst.get("server_id") or status.get("hostIP") or p["spec"]["nodeName"])
        devices = []
        for i, d in enumerate(sorted(inst["devices"], key=_device_key)):
            entry = {"device_id": str(d["device_id"]), "device_ip": str(d.get("device_ip", "")),
                     "rank_id": str(rank * shape.devices_per_pod + i)}
            if super_pod:
                if "super_device_id" not in d:
                    raise RankTableError(f"server {server_id}: super-pod job without super_device_id on NPU "
                                         f"{d['device_id']}")
                entry["super_device_id"] = str(d["super_device_id"])
            devices.append(entry)
        servers.append({"server_id": server_id, "host_ip": str(inst.get("host_ip") or status.get("hostIP") or ""),
                        "container_ip": str(status["podIP"]), "device": devices})
        if super_pod:
            vid = shape.logical_super_pod(rank)
            if len(super_pods) == vid:
                super_pods.append({"super_pod_id": str(vid), "server_list": []})
            super_pods[vid]["server_list"].append({"server_id": server_id})
    table: dict[str, Any] = {"status": "completed", "version": shape.version,
                             "server_count": str(len(servers)), "server_list": servers}
    if super_pod:
        table["super_pod_list"] = super_pods
    return table


def pod_env(shape: Layout, pod_rank: int, connect_timeout_s: int, deterministic: bool) -> dict[str, str]:
    """HCCL variables of pod ``pod_rank``, fixed before any process starts (HCCL reads them at init)."""
    env = {"HCCL_CONNECT_TIMEOUT": str(connect_timeout_s),
           "HCCL_LOGIC_SUPERPOD_ID": str(shape.logical_super_pod(pod_rank))}
    if deterministic:
        env["HCCL_DETERMINISTIC"] = "true"
    return env


def job_annotations(body: dict[str, Any]) -> dict[str, str]:
    """The MindCluster annotations (sp-block, schedule policy) a trex job carries."""
    ann = (body.get("metadata") or {}).get("annotations") or {}
    return {k: str(ann[k]) for k in JOB_ANNOTATIONS if isinstance(ann, dict) and k in ann}


def node_selector(spec: CommonSpec, defaults: ClusterDefaults) -> dict[str, str]:
    """The pods' nodeSelector: the job's, plus the cluster's accelerator-type for npu jobs that name none."""
    out = dict(spec.node_selector)
    if spec.device_type == "npu" and defaults.npu_accelerator_type:
        out.setdefault(ACCELERATOR_TYPE_LABEL, defaults.npu_accelerator_type)
    return out


def ascend_layout(body: dict[str, Any], spec: CommonSpec, defaults: ClusterDefaults) -> Layout | None:
    """The rank-table layout of an npu TrainJob (None for other jobs); LayoutError names a bad annotation,
    or a missing schedule policy, without which Volcano's huawei-npu plugin never places huawei.com/npu pods."""
    if spec.device_type != "npu":
        return None
    if defaults.npu_mindcluster and defaults.npu_resource == UNIFIED_RESOURCE \
            and SCHEDULE_POLICY_ANNOTATION not in job_annotations(body):
        raise LayoutError(f"metadata.annotations[{SCHEDULE_POLICY_ANNOTATION}]: required on this cluster (NPUs as "
                          f"{UNIFIED_RESOURCE}): Volcano's huawei-npu plugin schedules those pods only by a schedule "
                          "policy, e.g. chip8-node8 (Atlas 800T A2) or chip2-node16 (Atlas A3)")
    if body.get("kind") != "TrainJob":
        return None
    return layout(job_annotations(body), node_selector(spec, defaults), spec.devices_per_replica, spec.replicas)

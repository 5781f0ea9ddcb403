"""HCCL rank table (hccl.json) for Ascend TrainJobs, rendered from the device plugin's pod annotations.

Formats (published by Huawei):
- The Ascend device plugin (MindX DL, component ascend-device-plugin) annotates each pod it allocates
  NPUs to with ``ascend.kubectl.kubernetes.io/ascend-910-configuration``: a JSON "Instance"
  ``{"pod_name", "server_id", "host_ip", "super_pod_id", "devices": [{"device_id", "device_ip",
  "super_device_id"?}]}`` (see ascend-device-plugin's ``Instance``/``Device`` types and the MindX
  cluster-scheduling "Pod Annotations" table: "data source for Ascend Operator to generate hccl.json").
- The rank table read by HCCL (CANN "rank table configuration file"): ``{"status": "initializing" |
  "completed", "version": "1.0", "server_count", "server_list": [{"server_id", "host_ip"?, "device":
  [{"device_id", "device_ip", "rank_id"}]}]}``; for Atlas A3 super-pods version "1.2", each device also
  carries ``super_device_id`` and a ``super_pod_list`` groups the servers by ``super_pod_id``.
  All numbers are strings in both formats.
"""

from __future__ import annotations

import json
from typing import Any

ANNOTATION = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
ACCELERATOR_TYPE_LABEL = "accelerator-type"
"""MindX node label naming the server type, e.g. module-910b-8 (A2) or module-a3-16-super-pod (A3)."""
RANK_TABLE_KEY = "hccl.json"


def initializing() -> dict[str, Any]:
    """The table before every pod has its devices: HCCL must not start yet."""
    return {"status": "initializing"}


def is_super_pod(node_labels: dict[str, str]) -> bool:
    """True on Atlas A3 super-pod nodes (rank table version 1.2)."""
    value = node_labels.get(ACCELERATOR_TYPE_LABEL, "")
    return "super-pod" in value or value.startswith("module-a3")


class RankTableError(ValueError):
    """An annotation that cannot be turned into a rank table (message names the pod)."""


def _instance(pod: dict[str, Any]) -> dict[str, Any] | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANNOTATION)
    if not raw:
        return None
    try:
        inst = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise RankTableError(f"pod {meta.get('name')}: annotation {ANNOTATION} is not JSON: {exc}") from None
    if not isinstance(inst, dict) or not isinstance(inst.get("devices"), list):
        raise RankTableError(f"pod {meta.get('name')}: annotation {ANNOTATION} has no 'devices' list")
    return inst


def _device_key(d: Any) -> int:
    try:
        return int(d["device_id"])
    except (KeyError, TypeError, ValueError):
        raise RankTableError(f"device entry {d!r} has no integer device_id") from None


def render(pods_by_rank: list[dict[str, Any]], devices_per_pod: int,
           node_labels: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The rank table for pods ordered by pod rank; ``initializing`` until every pod is annotated.

    rank_id = podRank x devicesPerPod + i, where i orders the pod's devices by device_id.
    Version 1.2 (with super_device_id and super_pod_list) when the first pod's node is an A3 super-pod.
    """
    instances: list[dict[str, Any]] = []
    for p in pods_by_rank:
        inst = _instance(p)
        if inst is None or not (p.get("spec") or {}).get("nodeName"):
            return initializing()
        if len(inst["devices"]) != devices_per_pod:
            name = (p.get("metadata") or {}).get("name")
            raise RankTableError(f"pod {name}: the device plugin assigned {len(inst['devices'])} devices, "
                                 f"expected devicesPerReplica={devices_per_pod}")
        instances.append(inst)
    first_node = str((pods_by_rank[0].get("spec") or {}).get("nodeName", "")) if pods_by_rank else ""
    super_pod = is_super_pod(node_labels.get(first_node, {}))
    servers: list[dict[str, Any]] = []
    pods_of_super: dict[str, list[dict[str, str]]] = {}
    for rank, (p, inst) in enumerate(zip(pods_by_rank, instances, strict=True)):
        server_id = str(inst.get("server_id") or (p.get("status") or {}).get("hostIP") or p["spec"]["nodeName"])
        devices = []
        for i, d in enumerate(sorted(inst["devices"], key=_device_key)):
            entry = {"device_id": str(d["device_id"]), "device_ip": str(d.get("device_ip", "")),
                     "rank_id": str(rank * devices_per_pod + i)}
            if super_pod:
                if "super_device_id" not in d:
                    raise RankTableError(f"server {server_id}: super-pod node without super_device_id")
                entry["super_device_id"] = str(d["super_device_id"])
            devices.append(entry)
        server: dict[str, Any] = {"server_id": server_id}
        host_ip = inst.get("host_ip") or (p.get("status") or {}).get("hostIP")
        if host_ip:
            server["host_ip"] = str(host_ip)
        server["device"] = devices
        servers.append(server)
        if super_pod:
            pods_of_super.setdefault(str(inst.get("super_pod_id", "0")), []).append({"server_id": server_id})
    table: dict[str, Any] = {"status": "completed", "version": "1.2" if super_pod else "1.0",
                             "server_count": str(len(servers)), "server_list": servers}
    if super_pod:
        table["super_pod_list"] = [{"super_pod_id": k, "server_list": v} for k, v in pods_of_super.items()]
    return table

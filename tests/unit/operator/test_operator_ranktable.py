"""HCCL rank table golden tests on device-plugin annotation samples in the published formats."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from trex_operator import ranktable
from trex_operator.engine import plan_job
from trex_operator.plan import Observed

ANN = "ascend.kubectl.kubernetes.io/ascend-910-configuration"


def _pod(name: str, rank: int, node: str | None, instance: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj",
                                                     "trex.dev/attempt": "0", "trex.dev/replica-index": str(rank)}}
    if instance is not None:
        meta["annotations"] = {ANN: json.dumps(instance)}
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


# Annotation samples as the Ascend device plugin writes them (Instance: pod_name, server_id, host_ip,
# super_pod_id, devices[{device_id, device_ip, super_device_id}]); devices deliberately out of order.
A2_POD0 = {"pod_name": "tj-worker-0-a0", "server_id": "192.168.10.11", "host_ip": "192.168.10.11", "super_pod_id": 0,
           "devices": [{"device_id": "1", "device_ip": "10.20.0.2"}, {"device_id": "0", "device_ip": "10.20.0.1"}]}
A2_POD1 = {"pod_name": "tj-worker-1-a0", "server_id": "192.168.10.12", "host_ip": "192.168.10.12", "super_pod_id": 0,
           "devices": [{"device_id": "0", "device_ip": "10.20.1.1"}, {"device_id": "1", "device_ip": "10.20.1.2"}]}

A2_EXPECTED = {
    "status": "completed", "version": "1.0", "server_count": "2",
    "server_list": [
        {"server_id": "192.168.10.11", "host_ip": "192.168.10.11", "device": [
            {"device_id": "0", "device_ip": "10.20.0.1", "rank_id": "0"},
            {"device_id": "1", "device_ip": "10.20.0.2", "rank_id": "1"}]},
        {"server_id": "192.168.10.12", "host_ip": "192.168.10.12", "device": [
            {"device_id": "0", "device_ip": "10.20.1.1", "rank_id": "2"},
            {"device_id": "1", "device_ip": "10.20.1.2", "rank_id": "3"}]},
    ],
}


def test_a2_rank_table_golden() -> None:
    pods = [_pod("tj-worker-0-a0", 0, "n1", A2_POD0), _pod("tj-worker-1-a0", 1, "n2", A2_POD1)]
    labels = {"n1": {"accelerator-type": "module-910b-8"}, "n2": {"accelerator-type": "module-910b-8"}}
    assert ranktable.render(pods, 2, labels) == A2_EXPECTED


def test_a3_super_pod_rank_table_golden() -> None:
    p0 = {**A2_POD0, "super_pod_id": 7, "devices": [{"device_id": "0", "device_ip": "10.20.0.1", "super_device_id": "65536"},
                                                   {"device_id": "1", "device_ip": "10.20.0.2", "super_device_id": "65537"}]}
    p1 = {**A2_POD1, "super_pod_id": 8, "devices": [{"device_id": "1", "device_ip": "10.20.1.2", "super_device_id": "131073"},
                                                   {"device_id": "0", "device_ip": "10.20.1.1", "super_device_id": "131072"}]}
    pods = [_pod("a", 0, "n1", p0), _pod("b", 1, "n2", p1)]
    table = ranktable.render(pods, 2, {"n1": {"accelerator-type": "module-a3-16-super-pod"}})
    assert table["version"] == "1.2"
    assert [[(d["device_id"], d["super_device_id"], d["rank_id"]) for d in s["device"]] for s in table["server_list"]] == [
        [("0", "65536", "0"), ("1", "65537", "1")], [("0", "131072", "2"), ("1", "131073", "3")]]
    assert table["super_pod_list"] == [{"super_pod_id": "7", "server_list": [{"server_id": "192.168.10.11"}]},
                                       {"super_pod_id": "8", "server_list": [{"server_id": "192.168.10.12"}]}]


def test_initializing_until_every_pod_is_annotated_and_bound() -> None:
    assert ranktable.render([_pod("a", 0, "n1", A2_POD0), _pod("b", 1, None, A2_POD1)], 2, {}) == {"status": "initializing"}
    assert ranktable.render([_pod("a", 0, "n1", A2_POD0), _pod("b", 1, "n2", None)], 2, {}) == {"status": "initializing"}


def test_wrong_device_count_is_reported() -> None:
    with pytest.raises(ranktable.RankTableError, match="expected devicesPerReplica=8"):
        ranktable.render([_pod("a", 0, "n1", A2_POD0)], 8, {})


def test_operator_writes_rank_table_into_config_map() -> None:
    body = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "ns", "uid": "u"},
            "spec": {"replicas": 2, "devicesPerReplica": 2, "deviceType": "npu", "trainer": {}},
            "status": {"phase": "Starting", "attempt": 0}}
    obs = Observed(now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    obs.pods = [_pod("tj-worker-1-a0", 1, "n2", A2_POD1), _pod("tj-worker-0-a0", 0, "n1", None)]
    cm = next(m for m in plan_job(body, obs).ensure if m["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["hccl.json"]) == {"status": "initializing"}
    obs.pods[1] = _pod("tj-worker-0-a0", 0, "n1", A2_POD0)
    plan = plan_job(body, obs)
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["hccl.json"]) == A2_EXPECTED
    cond = next(c for c in plan.status["conditions"] if c["type"] == "RankTableReady")
    assert cond["status"] == "True"

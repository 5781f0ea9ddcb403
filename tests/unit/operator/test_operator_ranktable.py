"""HCCL rank table golden tests on device-plugin annotation samples in the published (MindCluster) formats."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from trex_operator import ranktable
from trex_operator.engine import plan_job
from trex_operator.plan import Observed

ANN = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
ANN_NPU = "ascend.kubectl.kubernetes.io/ascend-npu-configuration"


def _pod(name: str, rank: int, node: str | None, instance: dict[str, Any] | None, pod_ip: str | None = None,
         key: str = ANN) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj",
                                                     "trex.dev/attempt": "0", "trex.dev/replica-index": str(rank)}}
    if instance is not None:
        meta["annotations"] = {key: json.dumps(instance)}
    spec = {"nodeName": node} if node else {}
    status: dict[str, Any] = {"phase": "Pending"}
    if node:
        status["podIP"] = pod_ip or f"172.16.0.{10 + rank}"
    return {"metadata": meta, "spec": spec, "status": status}


# Annotation samples as the Ascend device plugin writes them (Instance: pod_name, server_id, host_ip,
# super_pod_id, devices[{device_id, device_ip, super_device_id}]); devices deliberately out of order.
A2_POD0 = {"pod_name": "tj-worker-0-a0", "server_id": "192.168.10.11", "host_ip": "192.168.10.11", "super_pod_id": 0,
           "devices": [{"device_id": "1", "device_ip": "10.20.0.2"}, {"device_id": "0", "device_ip": "10.20.0.1"}]}
A2_POD1 = {"pod_name": "tj-worker-1-a0", "server_id": "192.168.10.12", "host_ip": "192.168.10.12", "super_pod_id": 0,
           "devices": [{"device_id": "0", "device_ip": "10.20.1.1"}, {"device_id": "1", "device_ip": "10.20.1.2"}]}

A2_EXPECTED = {
    "status": "completed", "version": "1.0", "server_count": "2",
    "server_list": [
        {"server_id": "192.168.10.11", "host_ip": "192.168.10.11", "container_ip": "172.16.0.10", "device": [
            {"device_id": "0", "device_ip": "10.20.0.1", "rank_id": "0"},
            {"device_id": "1", "device_ip": "10.20.0.2", "rank_id": "1"}]},
        {"server_id": "192.168.10.12", "host_ip": "192.168.10.12", "container_ip": "172.16.0.11", "device": [
            {"device_id": "0", "device_ip": "10.20.1.1", "rank_id": "2"},
            {"device_id": "1", "device_ip": "10.20.1.2", "rank_id": "3"}]},
    ],
}
V10 = ranktable.Layout("1.0", 0, 2, 2)


def _a3(pod: dict[str, Any], physical: int, base: int) -> dict[str, Any]:
    """An A3 instance: physical super_pod_id and super_device_ids (device_ip deliberately unset: HCCS only)."""
    return {**pod, "super_pod_id": physical,
            "devices": [{"device_id": str(i), "device_ip": "-1", "super_device_id": str(base + i)} for i in (1, 0)]}


def test_a2_rank_table_golden() -> None:
    pods = [_pod("tj-worker-0-a0", 0, "n1", A2_POD0), _pod("tj-worker-1-a0", 1, "n2", A2_POD1)]
    assert ranktable.render(pods, V10) == A2_EXPECTED


def test_unified_npu_annotation_is_read() -> None:
    """huawei.com/npu pods carry ...ascend-npu-configuration instead: same table, not initializing forever."""
    pods = [_pod("a", 0, "n1", A2_POD0, key=ANN_NPU), _pod("b", 1, "n2", A2_POD1, key=ANN_NPU)]
    assert ranktable.render(pods, V10) == A2_EXPECTED


@pytest.mark.parametrize(("annotations", "selector", "version"), [
    ({}, {}, "1.0"),
    ({}, {"accelerator-type": "module-910b-8"}, "1.0"),
    ({}, {"accelerator-type": "module-a3-16"}, "1.0"),  # an ordinary A3 server is not a super-pod
    ({}, {"accelerator-type": "module-a3-16-super-pod"}, "1.2"),
    ({}, {"accelerator-type": "module-a3-8-super-pod"}, "1.2"),
    ({"sp-block": "16"}, {}, "1.2"),
    ({"huawei.com/schedule_policy": "chip2-node16-sp"}, {}, "1.2"),
    ({"huawei.com/schedule_policy": "multilevel"}, {}, "1.2"),
    # an explicit non-super-pod schedule policy wins over the node type (ascend-operator's order)
    ({"huawei.com/schedule_policy": "chip4-node8"}, {"accelerator-type": "module-a3-16-super-pod"}, "1.0"),
])
def test_version_follows_mindcluster_rules(annotations: dict[str, str], selector: dict[str, str], version: str) -> None:
    assert ranktable.layout(annotations, selector, 16, 2).version == version


def test_super_pod_list_uses_logical_ids() -> None:
    """sp-block 4 with 2 devices per pod: pods 0,1 -> logical 0; pods 2,3 -> logical 1; the physical
    super_pod_id of the annotations (7, 7, 8, 8 here reversed) does not group the servers."""
    shape = ranktable.layout({"sp-block": "4"}, {}, 2, 4)
    assert [shape.logical_super_pod(r) for r in range(4)] == [0, 0, 1, 1]
    pods = []
    for r, phys in enumerate((8, 8, 7, 7)):
        inst = _a3({**A2_POD0, "server_id": f"192.168.10.{20 + r}", "host_ip": f"192.168.10.{20 + r}"}, phys,
                   65536 * (r + 1))
        for d in inst["devices"]:
            d["device_ip"] = f"10.30.{r}.{d['device_id']}"  # two logical super-pods talk over RoCE: IPs needed
        pods.append(_pod(f"p{r}", r, f"n{r}", inst))
    table = ranktable.render(pods, shape)
    assert table["version"] == "1.2" and table["server_count"] == "4"
    assert table["super_pod_list"] == [
        {"super_pod_id": "0", "server_list": [{"server_id": "192.168.10.20"}, {"server_id": "192.168.10.21"}]},
        {"super_pod_id": "1", "server_list": [{"server_id": "192.168.10.22"}, {"server_id": "192.168.10.23"}]}]
    assert [(d["device_id"], d["super_device_id"], d["rank_id"]) for d in table["server_list"][1]["device"]] == [
        ("0", "131072", "2"), ("1", "131073", "3")]
    assert ranktable.pod_env(shape, 3, 1200, False) == {"HCCL_CONNECT_TIMEOUT": "1200", "HCCL_LOGIC_SUPERPOD_ID": "1"}


def test_a3_super_pod_without_sp_block_is_one_logical_super_pod() -> None:
    shape = ranktable.layout({}, {"accelerator-type": "module-a3-16-super-pod"}, 2, 2)
    pods = [_pod("a", 0, "n1", _a3(A2_POD0, 7, 65536)), _pod("b", 1, "n2", _a3(A2_POD1, 8, 131072))]
    table = ranktable.render(pods, shape)  # device_ip "-1" is fine inside one super-pod (HCCS)
    assert table["super_pod_list"] == [{"super_pod_id": "0", "server_list": [{"server_id": "192.168.10.11"},
                                                                             {"server_id": "192.168.10.12"}]}]
    assert table["server_list"][0]["device"][0] == {"device_id": "0", "device_ip": "-1", "super_device_id": "65536",
                                                    "rank_id": "0"}


def test_missing_device_ip_is_refused_where_the_version_needs_it() -> None:
    bad = {**A2_POD1, "devices": [{"device_id": "0", "device_ip": "10.20.1.1"}, {"device_id": "1", "device_ip": "-1"}]}
    pods = [_pod("a", 0, "n1", A2_POD0), _pod("b", 1, "n2", bad)]
    with pytest.raises(ranktable.DeviceIPError, match=r"pod b on node n2: NPU 1 has no device IP"):
        ranktable.render(pods, V10)
    spans = ranktable.layout({"sp-block": "2"}, {}, 2, 2)  # two logical super-pods: RoCE between them
    a3 = [_pod("a", 0, "n1", _a3(A2_POD0, 0, 0)), _pod("b", 1, "n2", _a3(A2_POD1, 0, 16))]
    with pytest.raises(ranktable.DeviceIPError, match=r"version 1\.2"):
        ranktable.render(a3, spans)


def test_initializing_until_every_pod_is_annotated_bound_and_has_an_ip() -> None:
    assert ranktable.render([_pod("a", 0, "n1", A2_POD0), _pod("b", 1, None, A2_POD1)], V10) == {"status": "initializing"}
    assert ranktable.render([_pod("a", 0, "n1", A2_POD0), _pod("b", 1, "n2", None)], V10) == {"status": "initializing"}
    no_ip = _pod("b", 1, "n2", A2_POD1)
    del no_ip["status"]["podIP"]
    assert ranktable.render([_pod("a", 0, "n1", A2_POD0), no_ip], V10) == {"status": "initializing"}


def test_wrong_device_count_is_reported() -> None:
    with pytest.raises(ranktable.RankTableError, match="expected devicesPerReplica=8"):
        ranktable.render([_pod("a", 0, "n1", A2_POD0)], ranktable.Layout("1.0", 0, 8, 1))


@pytest.mark.parametrize("value", ["x", "0", "12", "48"])
def test_bad_sp_block_is_refused(value: str) -> None:
    with pytest.raises(ranktable.LayoutError, match=r"metadata.annotations\[sp-block\]"):
        ranktable.layout({"sp-block": value}, {}, 8, 4)


BODY = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj", "namespace": "ns", "uid": "u"},
        "spec": {"replicas": 2, "devicesPerReplica": 2, "deviceType": "npu", "trainer": {}},
        "status": {"phase": "Starting", "attempt": 0}}


def _obs(*pods: dict[str, Any]) -> Observed:
    obs = Observed(now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    obs.pods = list(pods)
    return obs


def test_operator_writes_rank_table_into_config_map() -> None:
    obs = _obs(_pod("tj-worker-1-a0", 1, "n2", A2_POD1), _pod("tj-worker-0-a0", 0, "n1", None))
    cm = next(m for m in plan_job(BODY, obs).ensure if m["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["hccl.json"]) == {"status": "initializing"}
    obs.pods[1] = _pod("tj-worker-0-a0", 0, "n1", A2_POD0)
    plan = plan_job(BODY, obs)
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["hccl.json"]) == A2_EXPECTED
    cond = next(c for c in plan.status["conditions"] if c["type"] == "RankTableReady")
    assert cond["status"] == "True"


def test_operator_fails_the_job_when_a_device_has_no_ip() -> None:
    bad = {**A2_POD1, "devices": [{"device_id": "0", "device_ip": "-1"}, {"device_id": "1", "device_ip": "10.0.0.2"}]}
    plan = plan_job(BODY, _obs(_pod("tj-worker-0-a0", 0, "n1", A2_POD0), _pod("tj-worker-1-a0", 1, "n2", bad)))
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "DeviceIPMissing")
    event = next(e for e in plan.events if e.reason == "DeviceIPMissing")
    assert event.type == "Warning" and "pod tj-worker-1-a0 on node n2: NPU 0 has no device IP" in event.message
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["hccl.json"]) == {"status": "initializing"}


def test_operator_refuses_a_bad_sp_block_as_invalid_spec() -> None:
    body = {**BODY, "metadata": {**BODY["metadata"], "annotations": {"sp-block": "3"}}}
    plan = plan_job(body, _obs())
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "InvalidSpec")
    assert "metadata.annotations[sp-block]: 3 must be a positive multiple of devicesPerReplica=2" in \
        plan.status["conditions"][-1]["message"]


def test_validate_refuses_a_bad_sp_block_with_one_line() -> None:
    from trex_operator.validate import check_document

    body = {**BODY, "metadata": {"name": "tj", "annotations": {"sp-block": "12"}}}
    body["spec"] = {**BODY["spec"], "devicesPerReplica": 8}
    (problem,) = check_document("f.yaml", 0, body).problems
    assert problem.line() == ("f.yaml: TrainJob/tj: metadata.annotations[sp-block]: 12 must be a positive multiple of "
                              "devicesPerReplica=8 that divides the job's 16 devices")
    assert check_document("f.yaml", 0, {**body, "metadata": {"name": "tj", "annotations": {"sp-block": "16"}}}).model

"""The MindCluster contract of npu pods: Volcano gang, huawei-npu plugin hints, HCCL env, entrypoint, defaults."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_operator_builders import all_children
from trex_operator.defaults import ClusterDefaults
from trex_operator.engine import plan_job
from trex_operator.plan import Manifest, Observed

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _body(kind: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "job", "namespace": "ns", "uid": "uid-1"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


NPU_TRAIN = {"replicas": 2, "deviceType": "npu", "devicesPerReplica": 8, "trainer": {"parallelism": {"ep": 2}}}


def _kids(body: dict[str, Any], env: dict[str, str] | None = None) -> list[Manifest]:
    return all_children(body, ClusterDefaults.from_env(env or {}))


def _status(body: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    return plan_job(body, Observed(now=NOW, defaults=ClusterDefaults.from_env(env))).status


def test_npu_jobs_default_to_the_volcano_gang_with_the_plugin_hints() -> None:
    """MindCluster (the default): gang volcano even when the cluster default gang is none; the PodGroup carries
    sp-block / schedule policy for the huawei-npu plugin, the pods their hccl/rankIndex and accelerator-type."""
    body = _body("TrainJob", NPU_TRAIN, {"sp-block": "16", "huawei.com/schedule_policy": "chip2-node16-sp",
                                         "unrelated": "x"})
    kids = _kids(body, {"TREX_DEFAULT_GANG": "none", "TREX_NPU_ACCELERATOR_TYPE": "module-a3-16-super-pod"})
    (pg,) = [m for m in kids if m["kind"] == "PodGroup"]
    assert pg["spec"]["minMember"] == 2
    assert pg["metadata"]["annotations"] == {"sp-block": "16", "huawei.com/schedule_policy": "chip2-node16-sp"}
    pods = sorted((m for m in kids if m["kind"] == "Pod"), key=lambda p: p["metadata"]["name"])
    for i, p in enumerate(pods):
        assert p["spec"]["schedulerName"] == "volcano"
        assert p["metadata"]["annotations"]["hccl/rankIndex"] == str(i)
        assert p["spec"]["nodeSelector"] == {"accelerator-type": "module-a3-16-super-pod"}
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert (env["HCCL_LOGIC_SUPERPOD_ID"], env["HCCL_CONNECT_TIMEOUT"]) == (str(i // 2), "1200")
        assert "HCCL_DETERMINISTIC" not in env
        c = p["spec"]["containers"][0]
        assert "command" not in c and c["args"][-4:] == ["trex", "train", "--config", "/etc/trex/trainer.yaml"]


def test_the_job_node_selector_wins_and_deterministic_sets_hccl_before_start() -> None:
    spec = {**NPU_TRAIN, "nodeSelector": {"accelerator-type": "module-910b-8"},
            "trainer": {**NPU_TRAIN["trainer"], "deterministic": True}}
    kids = _kids(_body("TrainJob", spec), {"TREX_NPU_ACCELERATOR_TYPE": "module-a3-16", "TREX_HCCL_CONNECT_TIMEOUT": "600"})
    for p in (m for m in kids if m["kind"] == "Pod"):
        assert p["spec"]["nodeSelector"] == {"accelerator-type": "module-910b-8"}
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert (env["HCCL_DETERMINISTIC"], env["HCCL_CONNECT_TIMEOUT"]) == ("true", "600")


@pytest.mark.parametrize("kind, spec", [
    ("TrainJob", NPU_TRAIN),
    ("KernelTuneJob", {"deviceType": "npu", "kernels": {"backend": "npu-ascendc"}}),
])
def test_mindcluster_refuses_npu_jobs_without_volcano(kind: str, spec: dict[str, Any]) -> None:
    st = _status(_body(kind, {**spec, "scheduling": {"gang": "none"}}), {})
    assert (st["phase"], st["reason"]) == ("Failed", "InvalidSpec")
    assert re.search(r"scheduling.gang: 'none' cannot run deviceType npu here: .*allocates NPUs only to pods that "
                     r"Volcano's huawei-npu plugin scheduled", st["conditions"][-1]["message"])
    st = _status(_body(kind, spec), {"TREX_VOLCANO_ENABLED": "false"})
    assert st["reason"] == "InvalidSpec" and "deviceType: npu needs Volcano on this cluster" in \
        st["conditions"][-1]["message"]


def test_without_mindcluster_npu_jobs_follow_the_cluster_default_gang() -> None:
    kids = _kids(_body("TrainJob", NPU_TRAIN), {"TREX_NPU_MINDCLUSTER": "false", "TREX_VOLCANO_ENABLED": "false"})
    assert not [m for m in kids if m["kind"] == "PodGroup"]
    assert all("schedulerName" not in m["spec"] for m in kids if m["kind"] == "Pod")


def test_cpu_and_gpu_pods_keep_command_and_get_no_ascend_annotations() -> None:
    kids = _kids(_body("TrainJob", {"replicas": 2, "trainer": {}}))
    for p in (m for m in kids if m["kind"] == "Pod"):
        c = p["spec"]["containers"][0]
        assert c["command"][:3] == ["python", "-m", "trex.runtime.launch"] and "args" not in c
        assert "hccl/rankIndex" not in (p["metadata"].get("annotations") or {})
        assert not {e["name"] for e in c["env"]} & {"HCCL_CONNECT_TIMEOUT", "RANK_TABLE_FILE"}


@pytest.mark.parametrize("env, message", [
    ({"TREX_NPU_MINDCLUSTER": "maybe"}, "TREX_NPU_MINDCLUSTER='maybe' is not a boolean"),
    ({"TREX_NPU_ACCELERATOR_TYPE": "module 910b"}, "TREX_NPU_ACCELERATOR_TYPE='module 910b' is not a label value"),
    ({"TREX_HCCL_CONNECT_TIMEOUT": "60"}, "TREX_HCCL_CONNECT_TIMEOUT=60 must be between 120 and 7200"),
    ({"TREX_HCCL_CONNECT_TIMEOUT": "10m"}, "TREX_HCCL_CONNECT_TIMEOUT='10m' is not an integer"),
])
def test_bad_ascend_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterDefaults.from_env(env)


def test_an_npu_model_server_is_placed_by_volcano_too() -> None:
    """The EvalJob's model server Deployment requests NPUs: under MindCluster it must be Volcano-placed too."""
    body = _body("EvalJob", {"deviceType": "npu", "evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/d"}],
                                                                 "model": {"kind": "openai", "name": "m"}},
                             "server": {"image": "vllm/vllm-openai:v0.6.0", "devices": 2}})
    dep = next(m for m in _kids(body, {"TREX_NPU_ACCELERATOR_TYPE": "module-910b-8"}) if m["kind"] == "Deployment")
    tmpl = dep["spec"]["template"]["spec"]
    assert tmpl["schedulerName"] == "volcano" and tmpl["nodeSelector"] == {"accelerator-type": "module-910b-8"}
    dep = next(m for m in _kids(body, {"TREX_NPU_MINDCLUSTER": "false"}) if m["kind"] == "Deployment")
    assert "schedulerName" not in dep["spec"]["template"]["spec"]


def test_validate_applies_the_cluster_ascend_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from trex_operator.validate import check_document, main

    body = _body("TrainJob", {**NPU_TRAIN, "scheduling": {"gang": "none"}})
    (problem,) = check_document("f.yaml", 0, body).problems
    assert problem.path == "spec.scheduling.gang" and problem.message.startswith("'none' cannot run deviceType npu")
    assert check_document("f.yaml", 0, body, ClusterDefaults.from_env({"TREX_NPU_MINDCLUSTER": "false"})).model
    f = tmp_path / "tj.yaml"
    f.write_text(yaml.safe_dump(body))
    monkeypatch.delenv("TREX_NPU_MINDCLUSTER", raising=False)
    assert main(["-q", str(f)]) == 1
    assert "spec.scheduling.gang: 'none' cannot run deviceType npu" in capsys.readouterr().out
    monkeypatch.setenv("TREX_NPU_MINDCLUSTER", "false")  # `trex validate` reads the operator's TREX_* variables
    assert main(["-q", str(f)]) == 0
    monkeypatch.setenv("TREX_NPU_MINDCLUSTER", "maybe")
    assert main(["-q", str(f)]) == 2 and "TREX_NPU_MINDCLUSTER='maybe'" in capsys.readouterr().err


def test_the_unified_npu_resource_needs_a_schedule_policy() -> None:
    env = {"TREX_NPU_RESOURCE": "huawei.com/npu"}
    for kind, spec in (("TrainJob", NPU_TRAIN), ("KernelTuneJob", {"deviceType": "npu", "kernels": {"backend": "npu-ascendc"}})):
        st = _status(_body(kind, spec), env)
        assert st["reason"] == "InvalidSpec"
        assert "metadata.annotations[huawei.com/schedule_policy]: required on this cluster" in st["conditions"][-1]["message"]
        ok = _body(kind, spec, {"huawei.com/schedule_policy": "chip8-node8"})
        (pg,) = [m for m in _kids(ok, env) if m["kind"] == "PodGroup"]
        assert pg["metadata"]["annotations"] == {"huawei.com/schedule_policy": "chip8-node8"}

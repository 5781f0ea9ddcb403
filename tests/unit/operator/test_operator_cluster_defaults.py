"""Cluster defaults (the chart's TREX_* env vars): parsing, and their effect on the planned children."""

from __future__ import annotations

import copy
import datetime as dt
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from test_operator_builders import all_children, example_bodies
from trex_operator.api import SchedulingSpec
from trex_operator.defaults import ClusterDefaults
from trex_operator.engine import plan_job
from trex_operator.plan import Manifest, Observed
from trex_operator.reconciler import Settings

REPO = Path(__file__).resolve().parents[3]
HELM = REPO / ".venv" / "bin" / "helm"
K8S = "1.33"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

# What a cluster administrator might pass (as the chart renders it: every value a string).
CLUSTER = {
    "TREX_DEFAULT_IMAGE_CPU": "registry.example.com/trex/cpu:1", "TREX_DEFAULT_IMAGE_GPU": "registry.example.com/trex/gpu:1",
    "TREX_DEFAULT_IMAGE_NPU": "registry.example.com/trex/npu:1", "TREX_SCRAPE_ANNOTATIONS": "true",
    "TREX_DEFAULT_GANG": "volcano", "TREX_VOLCANO_ENABLED": "true", "TREX_VOLCANO_DEFAULT_QUEUE": "training",
    "TREX_KUEUE_ENABLED": "true", "TREX_KUEUE_DEFAULT_QUEUE": "team-a", "TREX_NPU_RESOURCE": "example.com/npu",
    "TREX_GPU_RESOURCE": "amd.com/gpu", "TREX_RANK_TABLE_DIR": "/etc/hccl", "TREX_RANK_TABLE_FILE_NAME": "rank.json",
}


def _body(kind: str, spec: dict[str, Any], name: str = "job") -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "uid": "uid-1"}, "spec": spec}


def children(body: dict[str, Any], env: dict[str, str]) -> list[Manifest]:
    """Every child planned over the job's life (dependencies met, servers ready, shards done) under ``env``."""
    return all_children(body, ClusterDefaults.from_env(env))


def _pods(body: dict[str, Any], env: dict[str, str]) -> list[Manifest]:
    return sorted((m for m in children(body, env) if m["kind"] == "Pod"), key=lambda p: p["metadata"]["name"])


def _status(body: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    return plan_job(body, Observed(now=NOW, defaults=ClusterDefaults.from_env(env))).status


TRAIN = {"replicas": 2, "trainer": {}}


# ---- parsing -----------------------------------------------------------------------------------


def test_builtin_defaults_are_the_operator_behaviour_without_the_chart() -> None:
    d = ClusterDefaults.from_env({})
    assert d == ClusterDefaults()
    out = subprocess.run([str(REPO / "scripts" / "build_images.sh"), "--list"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    built = dict(line.split() for line in out.splitlines())
    assert dict(d.images) == {"cpu": built["workload-cpu"], "gpu": built["workload-cuda"],
                              "npu": built["workload-ascend"]}
    assert (d.npu_resource, d.gpu_resource) == ("huawei.com/Ascend910", "nvidia.com/gpu")
    assert (d.default_gang, d.volcano_default_queue, d.kueue_default_queue, d.scrape_annotations) == ("none", None,
                                                                                                      None, False)
    assert d.rank_table_file == "/etc/trex/hccl.json" and not d.rank_table_mounted_separately


def test_from_env_parses_every_variable() -> None:
    d = ClusterDefaults.from_env({**CLUSTER, "TREX_SCRAPE_ANNOTATIONS": "False", "TREX_KUEUE_ENABLED": "1",
                                  "TREX_KUEUE_DEFAULT_QUEUE": ""})
    assert dict(d.images) == {"cpu": "registry.example.com/trex/cpu:1", "gpu": "registry.example.com/trex/gpu:1",
                              "npu": "registry.example.com/trex/npu:1"}
    assert d.scrape_annotations is False and d.kueue_enabled is True and d.volcano_enabled is True
    assert (d.default_gang, d.volcano_default_queue, d.kueue_default_queue) == ("volcano", "training", None)
    assert (d.npu_resource, d.gpu_resource) == ("example.com/npu", "amd.com/gpu")
    assert d.rank_table_file == "/etc/hccl/rank.json" and d.rank_table_mounted_separately


def test_settings_from_env_reads_the_defaults_once() -> None:
    s = Settings.from_env({**CLUSTER, "TREX_OPERATOR_INTERVAL": "2.5"})
    assert s.interval_s == 2.5 and s.defaults.default_gang == "volcano" and s.defaults.npu_resource == "example.com/npu"
    assert Settings().defaults == ClusterDefaults()


@pytest.mark.parametrize(("name", "value"), [
    ("TREX_SCRAPE_ANNOTATIONS", "maybe"), ("TREX_VOLCANO_ENABLED", "enabled"), ("TREX_KUEUE_ENABLED", "2"),
    ("TREX_DEFAULT_GANG", "slurm"), ("TREX_VOLCANO_DEFAULT_QUEUE", "Team_A"), ("TREX_KUEUE_DEFAULT_QUEUE", "-q"),
    ("TREX_NPU_RESOURCE", "Ascend910"), ("TREX_GPU_RESOURCE", "nvidia.com/"), ("TREX_DEFAULT_IMAGE_GPU", "a b"),
    ("TREX_RANK_TABLE_DIR", "etc/hccl"), ("TREX_RANK_TABLE_DIR", "/etc/../x"), ("TREX_RANK_TABLE_DIR", "/dev/shm"),
    ("TREX_RANK_TABLE_DIR", "/refs/x"), ("TREX_RANK_TABLE_FILE_NAME", "a/b.json"),
    ("TREX_RANK_TABLE_FILE_NAME", ".."),
])
def test_bad_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        ClusterDefaults.from_env({name: value})


def test_inconsistent_combinations_are_rejected() -> None:
    with pytest.raises(ValueError, match="TREX_DEFAULT_GANG='kueue' needs TREX_KUEUE_ENABLED=true"):
        ClusterDefaults.from_env({"TREX_DEFAULT_GANG": "kueue", "TREX_KUEUE_ENABLED": "false"})
    with pytest.raises(ValueError, match="TREX_DEFAULT_GANG='volcano' needs TREX_VOLCANO_ENABLED=true"):
        ClusterDefaults.from_env({"TREX_DEFAULT_GANG": "volcano", "TREX_VOLCANO_ENABLED": "off"})
    with pytest.raises(ValueError, match=re.escape("TREX_RANK_TABLE_FILE_NAME='trainer.yaml'")):
        ClusterDefaults.from_env({"TREX_RANK_TABLE_FILE_NAME": "trainer.yaml"})


def test_the_chart_renders_env_the_operator_accepts() -> None:
    """What `helm template` puts on the operator container parses to the chart's documented values."""
    if not HELM.is_file():
        pytest.skip("helm is not installed in .venv/bin (make helm)")
    values = {"scheduling": {"defaultGang": "kueue"}, "kueue": {"enabled": True, "defaultQueue": "team-a"},
              "gpu": {"resourceName": "amd.com/gpu"}, "workloads": {"scrapeAnnotations": False}}
    out = subprocess.run([str(HELM), "template", "trex", str(REPO / "charts" / "trex"), "-n", "trex", "-f", "-"],
                         input=yaml.safe_dump(values), capture_output=True, text=True, check=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d.get("kind") in ("Deployment", "StatefulSet")]
    (container,) = [c for d in docs for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    d = Settings.from_env(env).defaults
    chart = yaml.safe_load((REPO / "charts" / "trex" / "values.yaml").read_text())
    assert d.images["npu"] == f"{chart['workloads']['images']['npu']['repository']}:" \
                              f"{chart['workloads']['images']['npu']['tag']}"
    assert (d.default_gang, d.kueue_enabled, d.kueue_default_queue) == ("kueue", True, "team-a")
    assert (d.volcano_enabled, d.volcano_default_queue) == (False, chart["volcano"]["defaultQueue"])
    assert (d.gpu_resource, d.npu_resource, d.scrape_annotations) == ("amd.com/gpu", chart["npu"]["resourceName"], False)
    rt = chart["npu"]["rankTable"]
    assert d.rank_table_file == f"{rt['mountPath']}/{rt['fileName']}"
    npu = chart["npu"]
    assert (d.npu_mindcluster, d.npu_accelerator_type, d.hccl_connect_timeout_s) == (
        npu["mindcluster"], npu["acceleratorType"] or None, npu["hcclConnectTimeout"])


# ---- images, scrape annotations, device resources -----------------------------------------------


def test_image_defaults_per_device_type_and_explicit_image_wins() -> None:
    cpu, gpu = _pods(_body("TrainJob", {"trainer": {}}), CLUSTER)[0], _pods(_body(
        "TrainJob", {"deviceType": "gpu", "devicesPerReplica": 2, "trainer": {}}), CLUSTER)[0]
    assert cpu["spec"]["containers"][0]["image"] == "registry.example.com/trex/cpu:1"
    assert gpu["spec"]["containers"][0]["image"] == "registry.example.com/trex/gpu:1"
    (own,) = _pods(_body("TrainJob", {"deviceType": "gpu", "image": "me/mine:2", "trainer": {}}), CLUSTER)
    assert own["spec"]["containers"][0]["image"] == "me/mine:2"
    (builtin,) = _pods(_body("KernelTuneJob", {"deviceType": "npu", "kernels": {"backend": "npu-ascendc"}}), {})
    assert builtin["spec"]["containers"][0]["image"] == "ghcr.io/trex-dev/trex-workload-ascend:0.1.0"


def test_scrape_annotations_follow_the_metrics_port() -> None:
    body = _body("ORDataJob", {"metricsPort": 9500, "ordata": {"shards": {"numShards": 2}}})
    jobs = [m for m in children(body, CLUSTER) if m["kind"] == "Job"]
    assert len(jobs) == 2
    for j in jobs:
        ann = j["spec"]["template"]["metadata"]["annotations"]
        assert {k: ann[k] for k in ann if k.startswith("prometheus.io/")} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "9500", "prometheus.io/path": "/metrics"}
    for p in _pods(_body("TrainJob", TRAIN), {**CLUSTER, "TREX_SCRAPE_ANNOTATIONS": "false"}):
        assert not any(k.startswith("prometheus.io/") for k in p["metadata"].get("annotations", {}))


def test_device_resources_come_from_the_cluster() -> None:
    (gpu,) = _pods(_body("TrainJob", {"deviceType": "gpu", "devicesPerReplica": 4, "trainer": {}}), CLUSTER)
    res = gpu["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"amd.com/gpu": "4"}, "limits": {"amd.com/gpu": "4"}}
    body = _body("EvalJob", {"deviceType": "npu", "evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/d"}],
                                                                 "model": {"kind": "openai", "name": "m"}},
                             "server": {"image": "vllm/vllm-openai:v0.6.0", "devices": 2}})
    dep = next(m for m in children(body, CLUSTER) if m["kind"] == "Deployment")
    srv = dep["spec"]["template"]["spec"]["containers"][0]
    assert srv["resources"]["limits"] == {"example.com/npu": "2"} and srv["image"] == "vllm/vllm-openai:v0.6.0"


# ---- gang and queue -----------------------------------------------------------------------------


def test_default_gang_volcano_with_default_queue() -> None:
    kids = children(_body("TrainJob", TRAIN), CLUSTER)
    (pg,) = [m for m in kids if m["kind"] == "PodGroup"]
    assert pg["spec"] == {"minMember": 2, "queue": "training"}
    pods = [m for m in kids if m["kind"] == "Pod"]
    assert len(pods) == 2
    assert all(p["spec"]["schedulerName"] == "volcano" for p in pods)
    assert all(p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == pg["metadata"]["name"] for p in pods)
    # a job's own queue wins; an evaluation with one pod per benchmark gets a PodGroup of its pods
    (pg,) = [m for m in children(_body("TrainJob", {**TRAIN, "scheduling": {"queue": "urgent"}}), CLUSTER)
             if m["kind"] == "PodGroup"]
    assert pg["spec"]["queue"] == "urgent"
    body = _body("EvalJob", {"evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/a"},
                                                           {"name": "mamo_easy", "path": "/b"}],
                                            "model": {"kind": "openai", "name": "m", "url": "http://m:8000/v1"}},
                             "podPerBenchmark": True})
    kids = children(body, CLUSTER)
    (pg,) = [m for m in kids if m["kind"] == "PodGroup"]
    assert pg["spec"]["minMember"] == 2 == len([m for m in kids if m["kind"] == "Pod"])


def test_explicit_gang_wins_over_the_default() -> None:
    kids = children(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "none"}}), CLUSTER)
    assert not [m for m in kids if m["kind"] == "PodGroup"]
    assert all("schedulerName" not in m["spec"] for m in kids if m["kind"] == "Pod")
    pods = _pods(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "kueue"}}), CLUSTER)
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for p in pods} == {"team-a"}
    assert {p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods} == {"2"}


def test_default_gang_kueue_and_none() -> None:
    env = {**CLUSTER, "TREX_DEFAULT_GANG": "kueue"}
    pods = _pods(_body("TrainJob", {**TRAIN, "scheduling": {"queue": "lq"}}), env)
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for p in pods} == {"lq"}
    pods = _pods(_body("TrainJob", TRAIN), {})
    assert all("schedulerName" not in p["spec"] and "kueue.x-k8s.io/queue-name" not in p["metadata"]["labels"]
               for p in pods)


def test_the_api_accepts_kueue_without_a_queue() -> None:
    assert SchedulingSpec.model_validate({"gang": "kueue"}).queue is None
    assert SchedulingSpec.model_validate({}).gang is None


def _failed_invalid(status: dict[str, Any]) -> str:
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec"), status
    return str(status["message"])


def test_kueue_without_any_queue_fails_the_job() -> None:
    env = {**CLUSTER, "TREX_KUEUE_DEFAULT_QUEUE": ""}
    msg = _failed_invalid(_status(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "kueue"}}), env))
    assert "scheduling.queue" in msg and "kueue" in msg
    msg = _failed_invalid(_status(_body("KernelTuneJob", {"kernels": {"backend": "cpu-c"}}),
                                  {**env, "TREX_DEFAULT_GANG": "kueue"}))
    assert "scheduling.queue" in msg
    assert not plan_job(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "kueue"}}),
                        Observed(now=NOW, defaults=ClusterDefaults.from_env(env))).ensure


def test_gang_disabled_on_the_cluster_fails_the_job() -> None:
    env = {**CLUSTER, "TREX_DEFAULT_GANG": "none", "TREX_VOLCANO_ENABLED": "false", "TREX_KUEUE_ENABLED": "false"}
    msg = _failed_invalid(_status(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "volcano"}}), env))
    assert "Volcano disabled" in msg
    msg = _failed_invalid(_status(_body("TrainJob", {**TRAIN, "scheduling": {"gang": "kueue", "queue": "q"}}), env))
    assert "Kueue disabled" in msg
    assert _status(_body("TrainJob", TRAIN), env)["phase"] == "Starting"


# ---- rank table ---------------------------------------------------------------------------------


NPU = {"replicas": 2, "deviceType": "npu", "devicesPerReplica": 8, "trainer": {"parallelism": {"ep": 2}}}


def test_rank_table_mounted_from_its_own_directory() -> None:
    kids = children(_body("TrainJob", NPU), CLUSTER)
    cm = next(m for m in kids if m["kind"] == "ConfigMap")
    assert set(cm["data"]) == {"trainer.yaml", "rank.json"}
    assert yaml.safe_load(cm["data"]["rank.json"]) == {"status": "initializing"}
    for p in (m for m in kids if m["kind"] == "Pod"):
        c = p["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in c["env"]}["RANK_TABLE_FILE"] == "/etc/hccl/rank.json"
        vols = {v["name"]: v for v in p["spec"]["volumes"]}
        (rt,) = [v for v in vols.values() if (v.get("configMap") or {}).get("items")]
        assert rt["configMap"] == {"name": cm["metadata"]["name"], "items": [{"key": "rank.json", "path": "rank.json"}]}
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == rt["name"]]
        assert mount == {"name": rt["name"], "mountPath": "/etc/hccl", "readOnly": True}
        assert c["resources"]["limits"]["example.com/npu"] == "8"


def test_rank_table_in_the_config_directory_needs_no_extra_volume() -> None:
    env = {"TREX_RANK_TABLE_DIR": "/etc/trex/", "TREX_RANK_TABLE_FILE_NAME": "table.json"}
    kids = children(_body("TrainJob", NPU), env)
    cm = next(m for m in kids if m["kind"] == "ConfigMap")
    assert "table.json" in cm["data"]
    for p in (m for m in kids if m["kind"] == "Pod"):
        c = p["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in c["env"]}["RANK_TABLE_FILE"] == "/etc/trex/table.json"
        assert [v["name"] for v in p["spec"]["volumes"] if "configMap" in v] == ["trex-config"]
    (pod,) = _pods(_body("TrainJob", {**NPU, "replicas": 1, "devicesPerReplica": 2,
                                      "trainer": {"parallelism": {"ep": 2}}}), CLUSTER | {"TREX_DEFAULT_IMAGE_NPU": ""})
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/trex-dev/trex-workload-ascend:0.1.0"


# ---- every example still validates under non-default cluster settings -----------------------------


@pytest.mark.parametrize("body", example_bodies(), ids=lambda b: f"{b['kind']}-{b['metadata']['name']}")
def test_examples_validate_strictly_under_cluster_defaults(body: dict[str, Any]) -> None:
    kids = children(copy.deepcopy(body), CLUSTER)
    assert {"Pod", "Job"} & {m["kind"] for m in kids}
    for m in kids:
        if m["kind"] == "PodGroup":  # Volcano CRD: not part of the core schemas
            continue
        kubernetes_validate.validate(m, K8S, strict=True)


def test_operator_cli_refuses_a_bad_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from trex_operator import cli

    monkeypatch.setenv("TREX_SCRAPE_ANNOTATIONS", "maybe")
    assert cli.main(["run", "--liveness", ""]) == 2
    assert "TREX_SCRAPE_ANNOTATIONS='maybe' is not a boolean" in capsys.readouterr().err

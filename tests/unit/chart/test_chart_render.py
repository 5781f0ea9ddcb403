"""The Helm chart: lint, render with several values sets, validate every object, reject bad values."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from trex_chart_helpers import CHART, HELM, NAMESPACE, REPO, VALUE_SETS, by_kind, helm, helm_available, render

K8S_VERSION = "1.35"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
KOPF_KINDS = {"KopfPeering", "ClusterKopfPeering"}

# kubernetes-validate knows only built-in kinds. The Prometheus Operator kinds are checked against
# this subset of their CRD schemas (the fields the chart sets, with their types and required keys).
_SELECTOR = {"type": "object", "additionalProperties": False,
             "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False,
                "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
_RELABEL = {"type": "object", "additionalProperties": False, "required": ["sourceLabels", "targetLabel"],
            "properties": {"sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                           "targetLabel": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"],
             "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": _RELABEL}}}
_META = {"type": "object", "required": ["name", "namespace"],
         "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                        "namespace": {"type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_RULE = {"type": "object", "additionalProperties": False, "required": ["expr"],
         "properties": {"alert": {"type": "string"}, "record": {"type": "string"}, "expr": {"type": "string"},
                        "for": {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                 "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
    "PodMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
    "PrometheusRule": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["groups"], "properties": {
            "groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "rules"],
                "properties": {"name": {"type": "string"}, "rules": {"type": "array", "minItems": 1, "items": _RULE}}}}}}}},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    helm_available()
    return {name: render(values, tmp_path_factory.mktemp(name)) for name, values in VALUE_SETS.items()}


def _check_object(obj: dict[str, Any], crds: dict[str, dict[str, Any]]) -> None:
    kind = obj["kind"]
    if kind in MONITORING_KINDS:
        jsonschema.validate(obj, MONITORING_SCHEMAS[kind])
    elif kind in KOPF_KINDS:
        crd = crds[kind]
        assert obj["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        assert ("namespace" in obj["metadata"]) == (crd["spec"]["scope"] == "Namespaced")
        jsonschema.validate({k: v for k, v in obj.items() if k == "status"},
                            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_helm_lint_every_values_set(tmp_path: Path) -> None:
    helm_available()
    for name, values in VALUE_SETS.items():
        res = helm("lint", str(CHART), "--strict", values=values, tmp=tmp_path)
        assert res.returncode == 0, f"{name}: {res.stdout}\n{res.stderr}"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_object_validates(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    objs = rendered[name]
    crds = {o["spec"]["names"]["kind"]: o for o in by_kind(objs, "CustomResourceDefinition")}
    assert {"TrainJob", "KernelTuneJob", "ORDataJob", "EvalJob"} <= set(crds)
    for obj in objs:
        _check_object(obj, crds)


def _kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {str(o["kind"]) for o in objs}


def test_monitor_objects_follow_the_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = _kinds
    assert not MONITORING_KINDS & kinds(rendered["default"])
    assert MONITORING_KINDS <= kinds(rendered["monitors-on"])
    off = rendered["monitors-off"]
    assert not MONITORING_KINDS & kinds(off)
    assert not by_kind(off, "ConfigMap")
    (dep,) = by_kind(off, "Deployment")
    assert "prometheus.io/scrape" not in dep["spec"]["template"]["metadata"]["annotations"]
    (cm,) = by_kind(rendered["default"], "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["trex.json"]) == json.loads((CHART / "dashboards" / "trex.json").read_text())
    (cm_mon,) = by_kind(rendered["monitors-on"], "ConfigMap")
    assert cm_mon["metadata"]["namespace"] == "monitoring"
    (pm,) = by_kind(rendered["monitors-on"], "PodMonitor")
    targets = {r["targetLabel"] for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert {"job_name", "rank"} <= targets  # the dashboard's template variable and legend labels
    (svc,) = [s for s in by_kind(rendered["default"], "Service") if s["metadata"]["name"].endswith("-metrics")]
    assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    (pm_ns,) = by_kind(rendered["namespaced-ha"], "PodMonitor")
    assert pm_ns["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def _container(objs: list[dict[str, Any]], kind: str = "Deployment") -> tuple[dict[str, Any], dict[str, Any]]:
    (workload,) = by_kind(objs, kind)
    pod = workload["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return pod, c


def _env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_operator_pod_is_locked_down_and_probed(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod, c = _container(rendered["default"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    health = next(p for p in c["ports"] if p["name"] == "health")["containerPort"]
    assert f"--liveness=http://0.0.0.0:{health}/healthz" in c["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # writable scratch on a read-only root


def _operator_cli(c: dict[str, Any]) -> tuple[Any, list[str]]:
    """The container's command line parsed by the operator's own argument parser."""
    from trex_operator.cli import _parser

    assert c["command"] == ["trex", "operator", "run"]
    # Kubernetes expands $(VAR) in args from the container env; a pod-index priority expands to an integer.
    expanded = [a.replace("$(TREX_OPERATOR_PRIORITY)", "1") for a in c["args"]]
    args, unknown = _parser().parse_known_args(["run", *expanded])
    return args, list(unknown)


def test_single_replica_is_standalone_and_never_overlaps(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (dep,) = by_kind(rendered["default"], "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    _, c = _container(rendered["default"])
    args, unknown = _operator_cli(c)
    assert unknown == []
    assert args.peering is None  # standalone
    assert args.namespace == []  # all namespaces
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert not [o for o in rendered["default"] if o["kind"] in KOPF_KINDS]
    assert _env(c)["TREX_OPERATOR_METRICS_PORT"] == "9090"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9090, "health": 8080, "webhook": 9443}


@pytest.mark.parametrize("name", ["namespaced-ha", "cluster-ha"])
def test_replicas_elect_one_leader_through_kopf_peering(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    objs = rendered[name]
    assert not by_kind(objs, "Deployment")
    (sts,) = by_kind(objs, "StatefulSet")
    replicas = VALUE_SETS[name]["operator"]["replicas"]
    assert sts["spec"]["replicas"] == replicas
    _, c = _container(objs, "StatefulSet")
    args, unknown = _operator_cli(c)
    # --priority is kopf's peering priority, accepted by the operator CLI and passed to kopf.
    assert unknown == []
    assert "--priority=$(TREX_OPERATOR_PRIORITY)" in c["args"] and args.priority == 1
    assert args.peering
    assert args.verbose == (VALUE_SETS[name]["operator"].get("logLevel") == "debug")
    peering = f"--peering={args.peering}"
    # Distinct priorities: the pod's StatefulSet ordinal, unique per pod by construction.
    assert _env(c)["TREX_OPERATOR_PRIORITY"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    crd_kinds = {o["spec"]["names"]["kind"] for o in by_kind(objs, "CustomResourceDefinition")}
    assert KOPF_KINDS <= crd_kinds
    namespaces = VALUE_SETS[name].get("watchNamespaces")
    peers = [o for o in objs if o["kind"] in KOPF_KINDS]
    if namespaces:
        assert sorted(o["metadata"]["namespace"] for o in peers) == sorted(namespaces)
        assert {o["kind"] for o in peers} == {"KopfPeering"}
        assert args.namespace == namespaces
    else:
        assert args.namespace == []
        assert [o["kind"] for o in peers] == ["ClusterKopfPeering"]
    assert all(o["metadata"]["name"] == peering.split("=", 1)[1] for o in peers)
    assert all("post-install" in o["metadata"]["annotations"]["helm.sh/hook"] for o in peers)


def test_scheduling_and_npu_values_reach_the_operator(rendered: dict[str, list[dict[str, Any]]]) -> None:
    env = _env(_container(rendered["volcano"])[1])
    assert env["TREX_DEFAULT_GANG"] == "volcano" and env["TREX_VOLCANO_ENABLED"] == "true"
    assert env["TREX_VOLCANO_DEFAULT_QUEUE"] == "training"
    env = _env(_container(rendered["kueue"])[1])
    assert env["TREX_DEFAULT_GANG"] == "kueue" and env["TREX_KUEUE_DEFAULT_QUEUE"] == "team-a"
    env = _env(_container(rendered["npu"])[1])
    assert env["TREX_NPU_RESOURCE"] == "huawei.com/Ascend910"
    assert env["TREX_RANK_TABLE_DIR"] == "/user/hccl" and env["TREX_RANK_TABLE_FILE_NAME"] == "hccl.json"
    assert env["TREX_DEFAULT_IMAGE_NPU"] == "registry.example.com/trex/trex-workload-ascend:0.1.0-cann8.5"
    env = _env(_container(rendered["default"])[1])
    assert env["TREX_DEFAULT_GANG"] == "none"


def test_default_images_are_the_ones_the_build_script_builds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    out = subprocess.run([str(REPO / "scripts" / "build_images.sh"), "--list"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    built = dict(line.split() for line in out.splitlines())
    assert set(built) == {p.name.removesuffix(".Dockerfile") for p in (REPO / "images").glob("*.Dockerfile")}
    _, c = _container(rendered["default"])
    assert c["image"] == built["operator"]
    env = _env(c)
    assert env["TREX_DEFAULT_IMAGE_CPU"] == built["workload-cpu"]
    assert env["TREX_DEFAULT_IMAGE_GPU"] == built["workload-cuda"]
    assert env["TREX_DEFAULT_IMAGE_NPU"] == built["workload-ascend"]
    from trex_operator.api import DEFAULT_IMAGE

    assert DEFAULT_IMAGE == built["workload-cpu"]  # jobs without spec.image use the CPU workload image
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["version"] == "0.1.0" and chart["appVersion"] == "0.1.0"
    assert built["operator"].endswith(":" + chart["appVersion"])


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"image": {"tag": "bad:tag"}}, "/image/tag"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"operator": {"replicas": "two"}}, "/operator/replicas"),
    ({"operator": {"replicas": 0}}, "/operator/replicas"),
    ({"bogus": 1}, "bogus"),
    ({"monitoring": {"podMonitor": {"enabeld": True}}}, "enabeld"),
    ({"alerts": {"mfuDropShare": 1.5}}, "/alerts/mfuDropShare"),
    ({"alerts": {"stallMinutes": "15"}}, "/alerts/stallMinutes"),
    ({"alerts": {"mfuDropFor": "ten minutes"}}, "/alerts/mfuDropFor"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"scheduling": {"defaultGang": "slurm"}}, "/scheduling/defaultGang"),
    ({"scheduling": {"defaultGang": "kueue"}}, "/kueue/enabled"),
    ({"operator": {"resources": {"limits": {"memory": "lots"}}}}, "/operator/resources/limits/memory"),
    ({"npu": {"rankTable": {"mountPath": "relative/dir"}}}, "/npu/rankTable/mountPath"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_schema_rejects_bad_values_naming_the_field(tmp_path: Path, values: dict[str, Any], field: str) -> None:
    helm_available()
    res = helm("template", "trex", str(CHART), "-n", NAMESPACE, values=values, tmp=tmp_path)
    assert res.returncode != 0
    assert "values don't meet the specifications of the schema" in res.stderr, res.stderr
    assert field in res.stderr, res.stderr


def test_values_schema_is_draft07_and_accepts_the_defaults() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))
    for values, _ in BAD_VALUES:  # the same bad values, checked by a second validator
        merged = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
        assert list(jsonschema.Draft7Validator(schema).iter_errors(merged)), values


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_helm_binary_is_v4() -> None:
    helm_available()
    out = subprocess.run([str(HELM), "version", "--short"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("v4."), out


def test_validating_webhook_serves_every_kind(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    import base64

    from trex_operator.api import KIND_INFO
    from trex_operator.webhook import handler_id

    objs = rendered["default"]
    (cfg,) = by_kind(objs, "ValidatingWebhookConfiguration")
    paths = {h["rules"][0]["resources"][0]: h["clientConfig"]["service"]["path"] for h in cfg["webhooks"]}
    assert paths == {info.plural: "/" + handler_id(kind) for kind, info in KIND_INFO.items()}
    for h in cfg["webhooks"]:
        assert h["rules"][0]["operations"] == ["CREATE", "UPDATE"] and h["failurePolicy"] == "Fail"
        assert base64.b64decode(h["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
    (secret,) = [o for o in by_kind(objs, "Secret") if o["metadata"]["name"].endswith("-webhook-tls")]
    assert secret["data"]["ca.crt"] == cfg["webhooks"][0]["clientConfig"]["caBundle"]
    pod, c = _container(objs)
    env = _env(c)
    assert env["TREX_OPERATOR_WEBHOOK_PORT"] == "9443" and env["TREX_OPERATOR_WEBHOOK_CERT"].endswith("tls.crt")
    assert {"name": "webhook-tls", "secret": {"secretName": secret["metadata"]["name"]}} in pod["volumes"]
    (hook_svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-webhook")]
    assert hook_svc["spec"]["ports"][0]["targetPort"] == "webhook"
    (ns_cfg,) = by_kind(rendered["namespaced-ha"], "ValidatingWebhookConfiguration")
    assert ns_cfg["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    managed = render({"webhook": {"certManager": {"enabled": True}, "url": "https://op.example:9443/"}}, tmp_path)
    (mcfg,) = by_kind(managed, "ValidatingWebhookConfiguration")
    assert mcfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].endswith("/trex-webhook")
    assert mcfg["webhooks"][0]["clientConfig"] == {"url": "https://op.example:9443/validate-trainjobs"}
    assert {o["kind"] for o in managed} >= {"Issuer", "Certificate"}
    assert not [o for o in by_kind(managed, "Secret") if o["metadata"]["name"].endswith("-webhook-tls")]
    assert not by_kind(render({"webhook": {"enabled": False}}, tmp_path), "ValidatingWebhookConfiguration")

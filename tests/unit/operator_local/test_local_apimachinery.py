"""The local API server's pure semantics: selectors, strategic merge patches, schema checks, tables,
garbage-collection decisions, OpenAPI documents, job-result metrics and scrape labels."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml
from trex_operator.crdgen import build_crd
from trex_operator.local import apimachinery as am
from trex_operator.local.kubelet import TARGET_LABELS, target_labels
from trex_operator.local.prometheus import panel_queries
from trex_operator.opmetrics import OperatorMetrics, result_samples

REPO = Path(__file__).resolve().parents[3]
LABELS = {"app": "trex", "tier": "gpu", "team": "or"}


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=trex", True), ("app==trex", True), ("app!=trex", False), ("missing!=x", True),
    ("tier in (gpu, npu)", True), ("tier notin (gpu)", False), ("missing notin (gpu)", True),
    ("team", True), ("!team", False), ("!missing", True), ("app=trex,tier in (npu)", False),
    ("app=trex, tier in (cpu,gpu), !missing", True), ("", True),
])
def test_label_selectors(selector: str, expected: bool) -> None:
    obj = {"metadata": {"labels": LABELS}}
    assert am.matches(obj, am.parse_label_selector(selector), []) is expected


def test_bad_selectors_are_rejected() -> None:
    for bad in ("a=b=c", "in (x)", "!a=b", "a in x"):
        with pytest.raises(ValueError):
            am.parse_label_selector(bad)
    with pytest.raises(ValueError):
        am.parse_field_selector("metadata.name")


def test_field_selectors_compare_values_at_paths() -> None:
    event = {"metadata": {"name": "e", "namespace": "ns"}, "involvedObject": {"kind": "TrainJob", "name": "t", "uid": "u1"},
             "type": "Normal"}
    sel = am.parse_field_selector("involvedObject.name=t,involvedObject.namespace=ns,involvedObject.uid=u1")
    assert not am.matches(event, [], sel)                      # involvedObject.namespace is absent: no match
    event["involvedObject"]["namespace"] = "ns"
    assert am.matches(event, [], sel)
    assert not am.matches(event, [], am.parse_field_selector("involvedObject.uid=u2"))
    assert am.matches(event, [], am.parse_field_selector("type!=Warning,metadata.name==e"))


def test_strategic_merge_merges_named_lists() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]},
                                   {"name": "b", "image": "y"}], "volumes": [{"name": "v", "emptyDir": {}}]}}
    patch = {"spec": {"containers": [{"name": "a", "image": "x2", "env": [{"name": "L", "value": "2"}]},
                                     {"name": "b", "$patch": "delete"}], "$setElementOrder/containers": [{"name": "a"}],
                      "volumes": None}}
    out = am.strategic_merge_patch(pod, patch)
    assert out == {"spec": {"containers": [{"name": "a", "image": "x2", "env": [{"name": "K", "value": "1"},
                                                                                {"name": "L", "value": "2"}]}]}}
    assert pod["spec"]["containers"][1] == {"name": "b", "image": "y"}        # the stored object is untouched


def test_unknown_fields_and_schema_problems_from_a_crd() -> None:
    schema = build_crd("TrainJob")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    doc = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "x", "anything": 1},
           "spec": {"replicas": 0, "trainer": {"maxStepz": 3, "maxSteps": "lots"}, "env": [{"name": "A", "value": "b"}]}}
    assert am.unknown_fields(schema, doc) == ["spec.trainer.maxStepz"]
    fields = [f for f, _msg in am.schema_problems(schema, doc)]
    assert fields == ["spec.replicas", "spec.trainer.maxSteps"]
    example = yaml.safe_load((REPO / "examples" / "quickstart" / "trainjob.yaml").read_text())
    assert am.unknown_fields(schema, example) == [] and am.schema_problems(schema, example) == []


def test_tables_use_printer_columns_and_ages() -> None:
    [res] = am.crd_resources(build_crd("TrainJob"))
    assert (res.short_names, res.categories, res.subresources) == (("tj",), ("trex",), ("status",))
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    obj = {"metadata": {"name": "t", "creationTimestamp": "2026-01-01T11:55:30Z"},
           "status": {"phase": "Running", "progress": {"step": 7.0, "mfu": 0.31}}}
    t = am.table(res, [obj], now)
    assert [c["name"] for c in t["columnDefinitions"]] == ["Name", "Phase", "Step", "MFU", "Loss", "Attempt", "Age"]
    assert t["rows"][0]["cells"] == ["t", "Running", 7, 0.31, None, None, "4m30s"]
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert [am.human_age(f"2026-01-01T{h}Z", now) for h in ("11:59:50", "10:00:00", "06:00:00")] == ["10s", "120m", "6h"]
    assert am.wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not am.wants_table("application/json")


def test_garbage_collection_decisions() -> None:
    def obj(*owners: str) -> dict[str, object]:
        return {"metadata": {"ownerReferences": [{"uid": o} for o in owners]}}

    objects = [("v1/pods", "ns", "only-job", obj("job")), ("v1/pods", "ns", "two-owners", obj("job", "other")),
               ("v1/pods", "ns", "unrelated", obj("other")), ("v1/configmaps", "ns", "free", obj())]
    decision = am.orphaned(objects, gone_uids={"job"}, live_uids={"other"})
    assert decision.delete == [("v1/pods", "ns", "only-job")]
    assert decision.release == [("v1/pods", "ns", "two-owners", [{"uid": "other"}])]
    assert am.orphaned(objects, {"job"}, set()).delete == [("v1/pods", "ns", "only-job"), ("v1/pods", "ns", "two-owners")]


def test_openapi_document_declares_field_validation_and_gvk() -> None:
    resources = am.crd_resources(build_crd("EvalJob"))
    doc = am.openapi_document(resources)
    schema = doc["components"]["schemas"]["dev.trex.v1alpha1.EvalJob"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "trex.dev", "version": "v1alpha1", "kind": "EvalJob"}]
    patch = doc["paths"]["/apis/trex.dev/v1alpha1/namespaces/{namespace}/evaljobs/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "EvalJob"
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][0].items()


def test_job_results_become_series_and_vanish_with_the_job() -> None:
    status = {"results": {"benchmarks": {"nl4opt": {"passAt1": 0.5}, "mamo": {"passAt1": 0.25}, "bad": {"passAt1": None}}}}
    assert result_samples(("EvalJob", "ns", "ev"), status) == {
        ("trex_job_pass_at_1", ("EvalJob", "ev", "ns", "nl4opt")): 0.5,
        ("trex_job_pass_at_1", ("EvalJob", "ev", "ns", "mamo")): 0.25}
    kernels = {"results": {"geomeanSpeedup": 1.5, "kernels": {"rmsnorm_fwd/fp32": {"speedup": 2.0}}}}
    assert result_samples(("KernelTuneJob", "ns", "k"), kernels) == {
        ("trex_job_kernel_speedup", ("KernelTuneJob", "k", "ns", "geomean")): 1.5,
        ("trex_job_kernel_speedup", ("KernelTuneJob", "k", "ns", "rmsnorm_fwd/fp32")): 2.0}
    assert result_samples(("TrainJob", "ns", "t"), {"results": {"mfu": 0.3, "loss": float("nan")}}) == {
        ("trex_job_mfu", ("TrainJob", "t", "ns")): 0.3}
    m = OperatorMetrics()
    m.job_results(("ORDataJob", "ns", "od"), {"results": {"accepted": 40}})
    assert 'trex_job_accepted_samples{job_kind="ORDataJob",job_name="od",namespace="ns"} 40.0' in m.exposition()
    m.job_results(("ORDataJob", "ns", "od"), None)
    assert "job_name=\"od\"" not in m.exposition()


def test_demo_scrape_labels_match_the_chart_podmonitor() -> None:
    template = (REPO / "charts" / "trex" / "templates" / "monitoring.yaml").read_text()
    relabel = {}
    lines = template.splitlines()
    for i, line in enumerate(lines):
        if "sourceLabels: [__meta_kubernetes_pod_label_" in line:
            source = line.split("__meta_kubernetes_pod_label_")[1].rstrip("]")
            relabel[lines[i + 1].split("targetLabel:")[1].strip()] = source
    assert relabel == {k: v.replace(".", "_").replace("/", "_").replace("-", "_") for k, v in TARGET_LABELS.items()}
    pod = {"metadata": {"name": "p", "namespace": "team", "labels": {"trex.dev/job-name": "j", "trex.dev/job-kind": "TrainJob",
                                                                    "trex.dev/replica-index": "0", "trex.dev/attempt": "1"}}}
    assert target_labels(pod) == {"namespace": "team", "pod": "p", "job_name": "j", "job_kind": "TrainJob", "rank": "0",
                                  "attempt": "1"}


def test_panel_queries_fill_the_dashboard_variables() -> None:
    dashboard = json.loads((REPO / "charts" / "trex" / "dashboards" / "trex.json").read_text())
    queries = panel_queries(dashboard, range_s=300)
    assert len(queries) == len(dashboard["panels"])
    for _title, exprs in queries:
        for e in exprs:
            assert "$" not in e, e
    assert any("trex_job_pass_at_1" in e for _t, exprs in queries for e in exprs)

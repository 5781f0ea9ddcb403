"""The CRDs' CEL `x-kubernetes-validations`, run by an independent CEL evaluator (cel-python) on values typed
from the schema as the API server types them: every rule compiles; each case `trex validate` rejects for a
cross-field rule is rejected by CEL at the same field; no valid example is rejected; and over a grid of
parallel degrees CEL never refuses a job that `trex validate` accepts."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from trex_operator.api import API_VERSION, KINDS
from trex_operator.cel import rules
from trex_operator.crdgen import build_crd
from trex_operator.validate import check_document, iter_documents

ROOT = Path(__file__).resolve().parents[3]
ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _typed(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` as a CEL value of the schema's type (number -> double even when written 1, as the API server)."""
    t = schema.get("type")
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if t == "number":
        return celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        return celtypes.ListType([_typed(v, schema.get("items", {})) for v in value])
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", {})
        return celtypes.MapType({celtypes.StringType(k): _typed(v, props.get(k, extra if isinstance(extra, dict) else {}))
                                 for k, v in value.items()})
    return celpy.json_to_cel(value)


def cel_failures(value: Any, schema: dict[str, Any], path: str = "spec") -> list[tuple[str, str]]:
    """(node path, message) of every rule that does not hold on ``value`` (an evaluation error counts too)."""
    out: list[tuple[str, str]] = []
    for r in schema.get("x-kubernetes-validations", []):
        prog = _PROGRAMS.get(r["rule"])
        if prog is None:
            prog = _PROGRAMS[r["rule"]] = ENV.program(ENV.compile(r["rule"]))
        result = prog.evaluate({"self": _typed(value, schema)})
        if result is not True and not (isinstance(result, celtypes.BoolType) and bool(result)):
            out.append((path, r["message"] if isinstance(result, celtypes.BoolType) else f"error {result}"))
    if isinstance(value, dict):
        for k, v in value.items():
            sub = schema.get("properties", {}).get(k)
            if sub is not None:
                out += cel_failures(v, sub, f"{path}.{k}")
    elif isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += cel_failures(v, schema["items"], f"{path}.{i}")
    return out


def _spec_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


SCHEMAS = {kind: _spec_schema(kind) for kind in KINDS}


def _doc(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": "x"}, "spec": spec}


def _cel_paths(doc: dict[str, Any]) -> list[str]:
    """Field paths CEL refuses: the node's path joined with the path its message starts with."""
    return [f"{node}.{msg.split(':')[0]}" for node, msg in cel_failures(doc["spec"], SCHEMAS[doc["kind"]])]


TRAIN = {"deviceType": "cpu", "trainer": {"model": {"preset": "tiny"}}}
EVAL = {"deviceType": "cpu", "evaluation": {"model": {"kind": "reference"},
                                             "benchmarks": [{"name": "nl4opt", "path": "/data/x.jsonl"}]}}
ORDATA = {"deviceType": "cpu", "ordata": {"count": 4}}
KERNELS = {"deviceType": "cpu", "kernels": {"backend": "cpu-c"}}


def _with(base: dict[str, Any], path: str, v: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = v
    return out


ROLLOUT: dict[str, Any] = {
    "deviceType": "gpu", "volumes": {"checkpoints": {"claimName": "ck"}}, "rollout": {"server": {"devicesPerReplica": 1}},
    "trainer": {"mode": "grpo", "data": {"train": "/data/p.jsonl"}, "checkpoint": {"initFromHf": "/checkpoints/hf"}}}


# (kind, spec, the field both must name)
REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("TrainJob", _with(_with(TRAIN, "replicas", 3), "trainer.parallelism", {"pp": 2}), "spec.trainer.parallelism.pp"),
    ("TrainJob", _with(_with(TRAIN, "devicesPerReplica", 4), "trainer.parallelism", {"tp": 3}),
     "spec.trainer.parallelism.tp"),
    ("TrainJob", _with(_with(TRAIN, "devicesPerReplica", 4), "trainer.parallelism", {"dp": 2}),
     "spec.trainer.parallelism.dp"),
    ("TrainJob", _with(_with(TRAIN, "devicesPerReplica", 4), "trainer.parallelism", {"ep": 8}),
     "spec.trainer.parallelism.ep"),
    ("TrainJob", _with(_with(TRAIN, "devicesPerReplica", 6), "trainer.parallelism", {"dpReplicate": 4}),
     "spec.trainer.parallelism.dpReplicate"),
    ("TrainJob", _with(TRAIN, "deviceModel", "h100"), "spec.deviceModel"),
    ("TrainJob", _with({**TRAIN, "deviceType": "gpu"}, "trainer.model.dtype", "fp64"), "spec.trainer.model.dtype"),
    ("TrainJob", _with({**TRAIN, "dataFrom": {"name": "corpus"}}, "trainer.data.train", "/data/a.jsonl"),
     "spec.dataFrom"),
    ("TrainJob", _with(TRAIN, "trainer.data", {"microBatchSize": 3, "globalBatchSize": 4}),
     "spec.trainer.data.globalBatchSize"),
    ("TrainJob", _with(TRAIN, "trainer.mode", "opd"), "spec.trainer.opd.teachers"),
    ("TrainJob", _with(_with(TRAIN, "trainer.mode", "opd"), "trainer.opd",
                       {"teachers": [{"weight": 2.0}]}),
     "spec.trainer.opd.teachers.0.name"),
    ("TrainJob", {**TRAIN, "deviceType": "npu", "devicesPerReplica": 6}, "spec.devicesPerReplica"),
    ("TrainJob", _with(TRAIN, "volumes", {"checkpoints": {"claimName": "a", "hostPath": "/b"}}),
     "spec.volumes.checkpoints.claimName"),
    ("TrainJob", _with(TRAIN, "volumes", {"checkpoints": {}}), "spec.volumes.checkpoints.claimName"),
    ("TrainJob", _with(TRAIN, "volumes", {"checkpoints": {"hostPath": "relative"}}),
     "spec.volumes.checkpoints.mountPath"),
    ("TrainJob", _with(ROLLOUT, "trainer.mode", "sft"), "spec.rollout.server"),
    ("TrainJob", _with(ROLLOUT, "trainer.rollout", {"servers": ["http://s:8000"]}), "spec.trainer.rollout.servers"),
    ("TrainJob", _with(ROLLOUT, "trainer.rollout", {"engine": "inprocess"}), "spec.trainer.rollout.engine"),
    ("TrainJob", _with({**ROLLOUT, "deviceType": "npu"}, "rollout.server.devicesPerReplica", 6),
     "spec.rollout.server.devicesPerReplica"),
    ("TrainJob", _with(ROLLOUT, "volumes", {"checkpoints": {"emptyDir": True}}), "spec.volumes.checkpoints"),
    ("TrainJob", _with(ROLLOUT, "trainer.checkpoint", {}), "spec.rollout.server"),
    ("KernelTuneJob", _with(KERNELS, "kernels.backend", "cuda-triton"), "spec.deviceType"),
    ("KernelTuneJob", _with(KERNELS, "kernels.suite", "none"), "spec.kernels.kernels"),
    ("ORDataJob", _with(ORDATA, "ordata.families", [{"name": "diet", "size": {"min": 5, "max": 3}}]),
     "spec.ordata.families.0.size.min"),
    ("ORDataJob", _with(ORDATA, "ordata.families", [{"name": "diet", "size": {"min": 12}}]),
     "spec.ordata.families.0.size.min"),
    ("ORDataJob", _with(ORDATA, "ordata.reconstruction", {"mode": "llm"}), "spec.ordata.reconstruction.endpoint"),
    ("EvalJob", _with(EVAL, "evaluation.model", {"kind": "openai", "url": "http://m/v1"}),
     "spec.evaluation.model.name"),
    ("EvalJob", _with(EVAL, "evaluation.model", {"kind": "transformers"}), "spec.evaluation.model.path"),
    ("EvalJob", _with(EVAL, "evaluation.model", {"kind": "openai", "name": "m"}), "spec.evaluation.model.url"),
    ("EvalJob", {**EVAL, "modelFrom": {"name": "train"}}, "spec.evaluation.model.kind"),
    ("EvalJob", _with({**EVAL, "modelFrom": {"name": "train"}}, "evaluation.model",
                      {"kind": "openai", "name": "m", "url": "http://m/v1"}), "spec.server"),
    ("EvalJob", _with(EVAL, "evaluation.k", [1, 4]), "spec.evaluation.model.sampling.temperature"),
]


@pytest.mark.parametrize(("kind", "spec", "field"), REJECTED, ids=[f"{c[0]}:{c[2]}" for c in REJECTED])
def test_cel_rejects_what_validate_rejects_at_the_same_field(kind: str, spec: dict[str, Any], field: str) -> None:
    doc = _doc(kind, spec)
    problems = [p.path for p in check_document("t.yaml", 0, doc).problems]
    assert field in problems, problems
    assert field in _cel_paths(doc), cel_failures(doc["spec"], SCHEMAS[kind])


def test_every_rule_is_in_a_crd_and_compiles() -> None:
    in_crds = {r["rule"] for kind in KINDS for r in _all_rules(SCHEMAS[kind])}
    for model, found in rules().items():
        for r in found:
            assert r.rule in in_crds, (model.__name__, r.rule)
            ENV.compile(r.rule)


def _all_rules(schema: Any) -> list[dict[str, str]]:
    if isinstance(schema, dict):
        return list(schema.get("x-kubernetes-validations", [])) + [r for v in schema.values() for r in _all_rules(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _all_rules(v)]
    return []


def test_no_valid_example_is_refused() -> None:
    docs = [c for c in iter_documents([str(ROOT / "examples")]) if c.model is not None]
    assert len(docs) >= 10
    for c in docs:
        assert cel_failures(c.raw["spec"], SCHEMAS[c.raw["kind"]]) == [], c.file
    assert cel_failures(TRAIN, SCHEMAS["TrainJob"]) == [] and cel_failures(EVAL, SCHEMAS["EvalJob"]) == []


def test_cel_never_refuses_a_parallel_layout_validate_accepts() -> None:
    refused = accepted = 0
    for replicas, per, tp, pp, ep, dp in itertools.product([1, 3], [2, 4], [1, 2], [1, 2], [1, 4], [None, 2]):
        par: dict[str, Any] = {"tp": tp, "pp": pp, "ep": ep} | ({"dp": dp} if dp else {})
        doc = _doc("TrainJob", {**TRAIN, "replicas": replicas, "devicesPerReplica": per,
                                "trainer": {**TRAIN["trainer"], "parallelism": par,
                                            "data": {"microBatchSize": 4, "globalBatchSize": 8}}})
        cel = cel_failures(doc["spec"], SCHEMAS["TrainJob"])
        valid = not check_document("t.yaml", 0, doc).problems
        assert not (cel and valid), (par, replicas, per, cel)
        refused += bool(cel)
        accepted += valid
    assert refused > 20 and accepted > 10, (refused, accepted)  # the grid exercises both sides


def test_the_shipped_crds_carry_the_rules() -> None:
    for kind in KINDS:
        plural = build_crd(kind)["spec"]["names"]["plural"]
        shipped = yaml.safe_load((ROOT / "crds" / f"trex.dev_{plural}.yaml").read_text())
        schema = shipped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert _all_rules(schema) == _all_rules(SCHEMAS[kind]) != []


def _rule_nodes(schema: dict[str, Any], bounded: bool = True, path: str = "spec") -> list[tuple[str, dict[str, Any], bool]]:
    """(path, node, every list above it has maxItems) of each schema node that carries rules."""
    out = [(path, schema, bounded)] if schema.get("x-kubernetes-validations") else []
    for k, sub in schema.get("properties", {}).items():
        out += _rule_nodes(sub, bounded, f"{path}.{k}")
    if "items" in schema:
        out += _rule_nodes(schema["items"], bounded and "maxItems" in schema, f"{path}[]")
    return out


def test_rules_stay_within_the_api_servers_cost_budget() -> None:
    # The API server refuses a CRD whose rules' estimated cost is too high; it estimates unbounded lists at
    # the request size limit. So no rule sits under an unbounded list, and a list a rule iterates is bounded.
    for kind, schema in SCHEMAS.items():
        for path, node, bounded in _rule_nodes(schema):
            assert bounded, f"{kind} {path}: a rule under a list without maxItems"
            for r in node["x-kubernetes-validations"]:
                for prop, sub in node.get("properties", {}).items():
                    iterated = any(f"self.{prop}{m}" in r["rule"] or f"self.{prop} : " in r["rule"]
                                   for m in (".exists(", ".all(", ".filter(", ".map("))
                    if sub.get("type") == "array" and f"self.{prop}" in r["rule"] and iterated:
                        assert "maxItems" in sub, f"{kind} {path}.{prop}: iterated by a rule without maxItems"

"""Pods that run untrusted programs (ORData, eval) take a RuntimeClass (gVisor, Kata); model servers do not."""

from __future__ import annotations

from typing import Any

import pytest
from test_operator_builders import _body, all_children
from trex.config_base import load_section
from trex_operator.api import EvalJob

EVAL = {"runtimeClassName": "gvisor",
        "evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/data/a"}], "model": {"kind": "openai", "name": "m"}},
        "server": {"image": "vllm/vllm-openai:v0.6.0", "args": ["--served-model-name", "m"]}}
ORDATA = {"runtimeClassName": "kata", "ordata": {"shards": {"numShards": 2}},
          "volumes": {"output": {"hostPath": "/tmp/x"}}}


def _pod_specs(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for m in all_children(body):
        if m["kind"] == "Pod":
            out[m["metadata"]["name"]] = m["spec"]
        elif m["kind"] in ("Job", "Deployment"):
            out[f'{m["kind"]}/{m["metadata"]["name"]}'] = m["spec"]["template"]["spec"]
    return out


def test_eval_and_ordata_pods_run_under_the_runtime_class_but_not_the_model_server() -> None:
    evals = _pod_specs(_body("EvalJob", EVAL))
    assert {n: s.get("runtimeClassName") for n, s in evals.items() if not n.startswith("Deployment/")} == {
        n: "gvisor" for n in evals if not n.startswith("Deployment/")}
    assert [s.get("runtimeClassName") for n, s in evals.items() if n.startswith("Deployment/")] == [None]
    ordata = _pod_specs(_body("ORDataJob", ORDATA))
    assert ordata and {s.get("runtimeClassName") for s in ordata.values()} == {"kata"}
    plain = _pod_specs(_body("ORDataJob", {k: v for k, v in ORDATA.items() if k != "runtimeClassName"}))
    assert {s.get("runtimeClassName") for s in plain.values()} == {None}


def test_a_bad_runtime_class_is_refused_naming_the_field() -> None:
    doc = {"apiVersion": "trex.dev/v1alpha1", "kind": "EvalJob", "metadata": {"name": "e"},
           "spec": {**EVAL, "runtimeClassName": "Not_A_Name"}}
    with pytest.raises(ValueError, match=r"runtimeClassName"):
        load_section(EvalJob, doc)

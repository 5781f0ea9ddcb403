"""Malformed or hostile objects never crash the planner: they end in Failed/InvalidSpec with a message."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trex_operator.api import JobStatus
from trex_operator.engine import plan_job
from trex_operator.plan import Observed

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["replicas", "devicesPerReplica", "deviceType", "trainer", "runPolicy", "scheduling", "volumes",
          "resources", "tolerations", "env", "nodeSelector", "metricsPort", "dataFrom", "image"]


def body(kind: str, spec: Any, status: Any = None, meta: Any = None) -> dict[str, Any]:
    b: dict[str, Any] = {"apiVersion": "trex.dev/v1alpha1", "kind": kind,
                         "metadata": meta if meta is not None else {"name": "j", "namespace": "ns", "uid": "u"},
                         "spec": spec}
    if status is not None:
        b["status"] = status
    return b


@pytest.mark.parametrize("spec", [
    None, [], "x", {"replicas": 10**9, "trainer": {}}, {"replicas": -1, "trainer": {}},
    {"trainer": {"maxSteps": "many"}}, {"trainer": None}, {}, {"trainer": {}, "runPolicy": {"backoffLimit": -5}},
    {"trainer": {}, "tolerations": "all"}, {"trainer": {}, "devicesPerReplica": 3, "deviceType": "npu"},
])
def test_hostile_train_specs_fail_cleanly(spec: Any) -> None:
    plan = plan_job(body("TrainJob", spec), Observed(now=NOW))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec"
    assert plan.status["message"] and not plan.ensure
    JobStatus.model_validate(plan.status, by_alias=True, by_name=False)


@pytest.mark.parametrize("status", ["garbage", [1, 2], {"phase": "Exploded"}, {"attempt": "x", "restarts": [1]},
                                    {"conditions": "none"}])
def test_garbage_status_is_replaced(status: Any) -> None:
    plan = plan_job(body("TrainJob", {"trainer": {}}, status=status), Observed(now=NOW))
    assert plan.status["phase"] in ("Starting", "Pending")


def test_missing_metadata_and_unknown_kind() -> None:
    assert plan_job(body("TrainJob", {"trainer": {}}, meta={"name": 5}), Observed(now=NOW)).status["phase"] == "Failed"
    assert plan_job(body("NotAKind", {}), Observed(now=NOW)).status == {}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["TrainJob", "KernelTuneJob", "ORDataJob", "EvalJob"]),
       spec=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5),
       status=json_values, pods=st.lists(json_values, max_size=3))
def test_fuzzed_objects_never_raise(kind: str, spec: dict[str, Any], status: Any, pods: list[Any]) -> None:
    obs = Observed(now=NOW, pods=[p for p in pods if isinstance(p, dict)])
    plan = plan_job(body(kind, spec, status=status), obs)
    assert plan.status.get("phase") in ("Failed", "Starting", "Pending", "Restarting", "Running", "Succeeded",
                                        "Suspended")


def test_reference_names_that_are_not_dns_labels_are_never_fetched() -> None:
    from trex_operator.reconciler import referenced

    assert referenced({"spec": {"dataFrom": {"name": "../../secrets/x"}, "kernelsFrom": {"name": "ok-name"}}}) == [
        ("KernelTuneJob", "ok-name")]


def test_planner_bug_is_reported_as_condition_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    from trex_operator import kinds

    def boom(self: object, ctx: object) -> None:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(kinds.TrainImpl, "run", boom)
    plan = plan_job(body("TrainJob", {"trainer": {}}, status={"phase": "Running", "attempt": 2}), Observed(now=NOW))
    assert plan.status["phase"] == "Running" and plan.status["attempt"] == 2 and not plan.ensure
    cond = next(c for c in plan.status["conditions"] if c["type"] == "ReconcileError")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "RuntimeError", "unexpected")

"""RBAC: the rendered roles grant exactly trex_operator/rbac.py's (apiGroup, resource, verb) triples
(plus kopf's peering objects when several replicas elect a leader) and nothing broader."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from trex_chart_helpers import CHART, NAMESPACE, VALUE_SETS, by_kind, helm_available, render
from trex_operator.rbac import RULES

Triple = tuple[str, str, str]
EXPECTED: set[Triple] = {(r.api_group, r.resource, v) for r in RULES for v in r.verbs}
# Cluster-scoped resources among the rules (a namespaced Role cannot grant them).
CLUSTER_SCOPED = {"nodes", "customresourcedefinitions", "namespaces", "clusterkopfpeerings"}
PEERING_VERBS = ("get", "list", "watch", "patch")


def _triples(rules: list[dict[str, Any]]) -> set[Triple]:
    out: set[Triple] = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def _check_bindings(objs: list[dict[str, Any]]) -> None:
    (sa,) = by_kind(objs, "ServiceAccount")
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for b in by_kind(objs, kind):
            assert b["roleRef"]["kind"] == role_kind
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
            roles = [r for r in by_kind(objs, role_kind) if r["metadata"]["name"] == b["roleRef"]["name"]
                     and r["metadata"].get("namespace") == b["metadata"].get("namespace")]
            assert len(roles) == 1, f"{kind} {b['metadata']['name']} points at a missing {role_kind}"
    assert by_kind(objs, "ClusterRole") or by_kind(objs, "Role")


@pytest.fixture(scope="module")
def objs_by_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    helm_available()
    names = ("default", "namespaced-ha", "cluster-ha")
    return {n: render(VALUE_SETS[n], tmp_path_factory.mktemp(n)) for n in names}


def test_rbac_module_has_no_wildcards() -> None:
    assert EXPECTED
    assert not any("*" in t for triple in EXPECTED for t in triple)


def test_cluster_wide_role_grants_exactly_rbac_py(objs_by_set: dict[str, list[dict[str, Any]]]) -> None:
    objs = objs_by_set["default"]
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")
    (role,) = by_kind(objs, "ClusterRole")
    granted = _triples(role["rules"])
    assert granted - EXPECTED == set(), f"broader than rbac.py: {sorted(granted - EXPECTED)}"
    assert EXPECTED - granted == set(), f"missing from the chart: {sorted(EXPECTED - granted)}"
    _check_bindings(objs)


def test_namespaced_mode_splits_rules_without_widening(objs_by_set: dict[str, list[dict[str, Any]]]) -> None:
    objs = objs_by_set["namespaced-ha"]
    namespaces = VALUE_SETS["namespaced-ha"]["watchNamespaces"]
    (cluster_role,) = by_kind(objs, "ClusterRole")
    cluster = _triples(cluster_role["rules"])
    assert {r for _, r, _ in cluster} <= CLUSTER_SCOPED, "only cluster-scoped resources belong in the ClusterRole"
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    peering = {("kopf.dev", "kopfpeerings", v) for v in PEERING_VERBS}
    for role in roles:
        namespaced = _triples(role["rules"])
        assert not {r for _, r, _ in namespaced} & CLUSTER_SCOPED
        assert namespaced | cluster == EXPECTED | peering, sorted((namespaced | cluster) ^ (EXPECTED | peering))
    _check_bindings(objs)


def test_peering_adds_only_kopf_peering_objects(objs_by_set: dict[str, list[dict[str, Any]]]) -> None:
    (role,) = by_kind(objs_by_set["cluster-ha"], "ClusterRole")
    granted = _triples(role["rules"])
    assert granted - EXPECTED == {("kopf.dev", "clusterkopfpeerings", v) for v in PEERING_VERBS}
    assert EXPECTED <= granted


def test_chart_rules_file_lists_each_rbac_py_rule() -> None:
    # Independent of helm: the data file the templates read holds rbac.py's rules, rule for rule.
    data = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    assert _triples(data["rules"]) == EXPECTED
    assert len(data["rules"]) == len(RULES)

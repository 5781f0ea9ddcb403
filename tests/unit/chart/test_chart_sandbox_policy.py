"""The chart's egress NetworkPolicy for the pods that run untrusted programs (EvalJob and ORDataJob pods)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
from test_chart_render import K8S_VERSION
from trex_chart_helpers import by_kind, helm_available, render


def test_chart_renders_a_valid_egress_policy_for_sandboxed_pods(tmp_path: Path) -> None:
    helm_available()
    values = {"sandboxNetworkPolicy": {"enabled": True, "namespaces": ["or-a", "or-b"], "allowCIDRs": ["10.0.12.7/32"]}}
    policies = by_kind(render(values, tmp_path), "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["or-a", "or-b"]
    for p in policies:
        kubernetes_validate.validate(p, K8S_VERSION, strict=True)
        spec = p["spec"]
        assert spec["policyTypes"] == ["Egress"]
        exprs = {e["key"]: (e["operator"], e["values"]) for e in spec["podSelector"]["matchExpressions"]}
        assert exprs == {"trex.dev/job-kind": ("In", ["EvalJob", "ORDataJob"]), "trex.dev/role": ("NotIn", ["server"])}
        tos = [t for rule in spec["egress"] for t in rule["to"]]
        assert {"ipBlock": {"cidr": "10.0.12.7/32"}} in tos
        assert {"podSelector": {"matchLabels": {"trex.dev/role": "server"}}} in tos
    assert by_kind(render({}, tmp_path), "NetworkPolicy") == []  # off by default

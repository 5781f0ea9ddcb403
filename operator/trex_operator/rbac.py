"""The exact API permissions the operator uses (its own requests and kopf's), as RBAC rules.

The Helm chart's ClusterRole is generated from :data:`RULES`; a test records every request the
operator makes against the emulator and checks that each is covered and that no rule is unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trex_operator.api import GROUP, KIND_INFO


@dataclass(frozen=True)
class Rule:
    """One RBAC policy rule: API group, resource (or resource/subresource) and verbs."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]


_JOBS = tuple(info.plural for info in KIND_INFO.values())

RULES: tuple[Rule, ...] = (
    # the four job kinds: kopf lists/watches and patches them (annotations); the reconciler re-reads
    # them, reads referenced jobs and deletes finished ones after ttlSecondsAfterFinished
    *(Rule(GROUP, plural, ("delete", "get", "list", "patch", "watch")) for plural in _JOBS),
    *(Rule(GROUP, f"{plural}/status", ("patch",)) for plural in _JOBS),
    Rule("", "pods", ("create", "delete", "get", "list", "watch")),
    Rule("", "configmaps", ("create", "get", "patch")),
    Rule("", "services", ("create", "delete", "get")),
    Rule("", "events", ("create",)),
    Rule("batch", "jobs", ("create", "delete", "get", "list", "watch")),
    Rule("apps", "deployments", ("create", "delete", "get", "list", "watch")),
    Rule("scheduling.volcano.sh", "podgroups", ("create", "get")),
    # kopf re-scans the served resources when CRDs change
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
)
"""Rules for the default cluster-wide mode."""

NAMESPACE_PATTERN_RULES: tuple[Rule, ...] = (Rule("", "namespaces", ("list", "watch")),)
"""Extra rules when `trex operator run -n` is given glob patterns (kopf then watches namespaces)."""


def covers(api_group: str, resource: str, verb: str, rules: tuple[Rule, ...] = RULES) -> bool:
    """Whether ``rules`` allow ``verb`` on ``api_group``/``resource``."""
    return any(r.api_group == api_group and r.resource == resource and verb in r.verbs for r in rules)


def cluster_role(name: str = "trex-operator") -> dict[str, Any]:
    """A ClusterRole granting :data:`RULES` (resources grouped per API group and verbs)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": [{"apiGroups": [r.api_group], "resources": [r.resource], "verbs": list(r.verbs)} for r in RULES],
    }

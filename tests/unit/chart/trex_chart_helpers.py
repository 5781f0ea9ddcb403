"""Helpers for the chart tests: run the real helm binary, split its output, walk PromQL."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "trex"
HELM = REPO / ".venv" / "bin" / "helm"
RELEASE = "trex"
NAMESPACE = "trex"

# Values sets rendered by the tests: name -> values document (passed with -f, so types are YAML's).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "monitors-on": {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                                   "prometheusRule": {"enabled": True}, "dashboard": {"namespace": "monitoring"}}},
    "monitors-off": {"monitoring": {"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": False},
                                    "prometheusRule": {"enabled": False}, "dashboard": {"enabled": False},
                                    "scrapeAnnotations": False}},
    "volcano": {"scheduling": {"defaultGang": "volcano"}, "volcano": {"enabled": True, "defaultQueue": "training"}},
    "kueue": {"scheduling": {"defaultGang": "kueue"}, "kueue": {"enabled": True, "defaultQueue": "team-a"}},
    "npu": {"npu": {"resourceName": "huawei.com/Ascend910", "rankTable": {"mountPath": "/user/hccl", "fileName": "hccl.json"}},
            "workloads": {"images": {"npu": {"repository": "registry.example.com/trex/trex-workload-ascend", "tag": "0.1.0-cann8.5"}}},
            "operator": {"nodeSelector": {"kubernetes.io/arch": "arm64"}}},
    "namespaced-ha": {"watchNamespaces": ["team-a", "team-b"], "operator": {"replicas": 2},
                      "monitoring": {"podMonitor": {"enabled": True}}},
    "cluster-ha": {"operator": {"replicas": 3, "logLevel": "debug", "extraEnv": [{"name": "X_Y", "value": "1"}]}},
}


def helm_available() -> None:
    """Skip loudly when the helm binary the Makefile installs is missing."""
    if not HELM.is_file():
        pytest.skip("helm binary missing at .venv/bin/helm (run `make` to install it); chart tests NOT run")


def helm(*args: str, values: dict[str, Any] | None = None, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with an optional values document written to a temporary file."""
    cmd = [str(HELM), *args]
    if values is not None:
        assert tmp is not None
        f = tmp / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(f)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def render(values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """`helm template` (hooks and CRDs included) parsed into objects."""
    res = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds", values=values, tmp=tmp)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [o for o in objs if o.get("kind") == kind]


def promql_metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects (parses it; a syntax error raises)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:
                raise AssertionError(f"selector without a metric name in {expr!r}")
            return
        for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is None:
                continue
            for c in child if isinstance(child, list) else [child]:
                walk(c)

    walk(promql_parser.parse(expr))
    return names

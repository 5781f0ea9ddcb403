"""Dashboard and alert rules: checked-in files equal a fresh generation, PromQL parses and names only
defined metrics, the chart renders the rules with the configured thresholds, runbooks exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest
import yaml
from trex.telemetry import dashboard as d
from trex.telemetry.metrics import exposed_names
from trex_chart_helpers import CHART, REPO, by_kind, helm_available, promql_metric_names, render

GRAFANA_VARS = {"namespace": "team-a|team-b", "job": ".*", "__rate_interval": "1m", "__range": "6h", "__interval": "30s",
                "datasource": "prom"}


def test_checked_in_dashboard_equals_fresh_generation() -> None:
    assert (CHART / "dashboards" / "trex.json").read_text() == d.dashboard_json(), \
        "charts/trex/dashboards/trex.json is stale: run python -m trex.telemetry.dashboard"


def test_checked_in_alerts_equal_fresh_generation() -> None:
    assert (CHART / "files" / "alerts.yaml").read_text() == d.alerts_file_text(), \
        "charts/trex/files/alerts.yaml is stale: run python -m trex.telemetry.dashboard"


def test_generator_check_mode_detects_drift(tmp_path: Path) -> None:
    dash, alerts = tmp_path / "d.json", tmp_path / "a.yaml"
    assert d.main(["--dashboard", str(dash), "--alerts", str(alerts)]) == 0
    assert d.main(["--dashboard", str(dash), "--alerts", str(alerts), "--check"]) == 0
    dash.write_text(dash.read_text().replace("MFU", "MFX"))
    assert d.main(["--dashboard", str(dash), "--alerts", str(alerts), "--check"]) == 1


def test_metric_name_walker_sees_every_selector() -> None:
    # The checker itself must be able to fail: an unknown name anywhere in the tree is reported.
    names = promql_metric_names('histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m]))) / on() y offset 1d - z')
    assert names == {"x_bucket", "y", "z"}
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(trex_train_mfu[5m])")


def _dashboard_exprs() -> list[str]:
    model = json.loads((CHART / "dashboards" / "trex.json").read_text())
    return [d.substitute(e, GRAFANA_VARS) for e in d.dashboard_exprs(model)]


def test_dashboard_promql_parses_and_names_only_defined_metrics() -> None:
    defined = exposed_names()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 14
    for e in exprs:
        unknown = promql_metric_names(e) - defined
        assert not unknown, f"{e!r} names undefined metrics {unknown}"


def test_dashboard_covers_the_required_views() -> None:
    model = json.loads((CHART / "dashboards" / "trex.json").read_text())
    used = set().union(*(promql_metric_names(e) for e in _dashboard_exprs()))
    for metric in ("trex_train_mfu", "trex_train_peak_flops", "trex_train_tokens_per_second", "trex_train_loss",
                   "trex_train_step_seconds", "trex_train_expert_load_cv", "trex_train_skipped_steps_total",
                   "trex_train_spikes_total", "trex_train_last_checkpoint_timestamp_seconds",
                   "trex_operator_restarts_total", "trex_ordata_samples_total", "trex_kernel_speedup",
                   "trex_eval_pass_at_k"):
        assert metric in used, f"no panel queries {metric}"
    exprs = d.dashboard_exprs(model)
    assert any(e.startswith("time() - ") and "last_checkpoint_timestamp" in e for e in exprs)
    assert any('k="1"' in e and "trex_eval_pass_at_k" in e for e in exprs)
    names = {v["name"] for v in model["templating"]["list"]}
    assert {"namespace", "job"} <= names
    # Every workload query is filtered by both template variables.
    for e in exprs:
        if re.search(r"trex_(train|kernel|ordata|eval)_", e):
            assert "$namespace" in e and "$job" in e, e
    # Panel ids are unique and panels fit the 24-column grid.
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in model["panels"])


def test_template_variable_queries_select_defined_metrics() -> None:
    pattern = re.compile(d.WORKLOAD_METRICS_RE)
    matched = {n for n in exposed_names() if pattern.fullmatch(n)}
    for prefix in ("trex_train_", "trex_kernel_", "trex_ordata_", "trex_eval_"):
        assert any(n.startswith(prefix) for n in matched), prefix
    assert not any(n.startswith("trex_operator_") for n in matched)
    for v in d.variables():
        if v["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"])
            assert inner, v["definition"]
            promql_parser.parse(d.substitute(inner.group(1), GRAFANA_VARS))


def test_substitute_rejects_unknown_variable() -> None:
    with pytest.raises(KeyError, match=r"\$nope"):
        d.substitute("x{a=~\"$nope\"}", {})


def test_alert_rules_parse_and_name_only_defined_metrics() -> None:
    defined = exposed_names()
    exprs = d.alert_exprs(d.alert_rules(d.DEFAULTS, "https://example.com/runbooks.md"))
    assert len(exprs) == 4
    for e in exprs:
        unknown = promql_metric_names(e) - defined
        assert not unknown, f"{e!r} names undefined metrics {unknown}"


def test_alert_rules_require_every_threshold() -> None:
    with pytest.raises(KeyError, match="stallMinutes"):
        d.alert_rules({k: v for k, v in d.DEFAULTS.items() if k != "stallMinutes"}, "x")


def test_python_defaults_match_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["alerts"]
    assert {k: str(v) for k, v in values.items() if k != "runbookBaseUrl"} == d.DEFAULTS


def test_rendered_prometheus_rule_uses_configured_thresholds(tmp_path: Path) -> None:
    helm_available()
    runbooks = "https://runbooks.example.com/trex.md"
    overrides: dict[str, object] = {"mfuDropShare": 0.35, "mfuDropFor": "20m", "stallMinutes": 42, "passAt1Drop": 0.1,
                 "passAt1Offset": "2d", "passAt1Window": "14d", "failedFor": "5m",
                 "runbookBaseUrl": runbooks}
    objs = render({"monitoring": {"prometheusRule": {"enabled": True}}, "alerts": overrides}, tmp_path)
    (rule,) = by_kind(objs, "PrometheusRule")
    rendered = rule["spec"]["groups"]
    params = {k: str(v) for k, v in overrides.items() if k != "runbookBaseUrl"}
    expected = d.alert_rules(params, runbooks)
    # Prometheus templates survive Helm's tpl untouched; thresholds and runbook URLs are substituted.
    assert json.loads(json.dumps(rendered)) == json.loads(json.dumps(expected))
    stalled = next(r for r in rendered[0]["rules"] if r["alert"] == "TrexTrainingStalled")
    assert "[42m]" in stalled["expr"]
    assert "{{ $labels.job_name }}" in stalled["annotations"]["summary"]
    mfu = next(r for r in rendered[0]["rules"] if r["alert"] == "TrexMFUDropped")
    assert "(1 - 0.35) * quantile_over_time(0.5, trex_train_mfu[1h])" in mfu["expr"]
    for e in d.alert_exprs(rendered):
        promql_parser.parse(e)


def test_every_alert_has_a_runbook_section() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbooks, flags=re.M)}
    for rule in d.alert_rules(d.DEFAULTS, "https://x/runbooks.md")[0]["rules"]:
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"docs/runbooks.md has no section for #{anchor} ({rule['alert']})"

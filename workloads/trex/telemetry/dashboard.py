"""The Grafana dashboard and the Prometheus alert rules, generated as code from the metric names.

Plain dicts (Grafana dashboard JSON model, Prometheus rule groups), so the output is reviewable and
stable. ``python -m trex.telemetry.dashboard`` rewrites the two files the Helm chart ships:
``charts/trex/dashboards/trex.json`` and ``charts/trex/files/alerts.yaml`` (rule groups whose
thresholds are Helm expressions over ``.Values.alerts``); a test fails when they drift from this code.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex.telemetry.metrics import BY_NAME, spec

UID = "trex-overview"
DASHBOARD_PATH = Path("charts/trex/dashboards/trex.json")
ALERTS_PATH = Path("charts/trex/files/alerts.yaml")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Series labels added by the scrape configuration (PodMonitor relabelings / static labels).
JOB_LABEL = "job_name"
RANK_LABEL = "rank"
SEL = f'namespace=~"$namespace", {JOB_LABEL}=~"$job"'
WORKLOAD_METRICS_RE = "trex_(train|kernel|ordata|eval|job)_.+"
RUNBOOK_DOC = "docs/runbooks.md"


def m(name: str) -> str:
    """A metric name checked against the one list (a typo is a KeyError at generation time)."""
    for suffix in ("_bucket", "_sum", "_count"):
        stem = name[: -len(suffix)]
        if name.endswith(suffix) and stem in BY_NAME and BY_NAME[stem].kind == "histogram":
            return name
    spec(name)
    return name


# --- dashboard ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel with its legend."""

    expr: str
    legend: str
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: title, kind, unit, queries and optional per-query unit overrides."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    right_axis: Mapping[str, str] = field(default_factory=dict)  # refId -> unit, drawn on the right axis
    stacked: bool = False


def panels() -> list[Panel]:
    """Every panel of the dashboard, in display order."""
    by_job = f"by ({JOB_LABEL})"
    return [
        Panel("MFU per job and rank", "Model FLOPs utilisation of each rank, and the peak FLOP/s it is computed "
              "against (right axis; label source = catalog or measured).",
              (Target(f"{m('trex_train_mfu')}{{{SEL}}}",
                      "{{job_name}} rank {{rank}} ({{device}}, {{flops_convention}})"),
               Target(f"{m('trex_train_peak_flops')}{{{SEL}}}", "peak {{job_name}} rank {{rank}} ({{source}})")),
              unit="percentunit", width=24, right_axis={"B": "flops"}),
        Panel("Tokens per second", "Training throughput summed over the ranks of each job.",
              (Target(f"sum {by_job} ({m('trex_train_tokens_per_second')}{{{SEL}}})", "{{job_name}}"),)),
        Panel("Loss", "Main LM loss of the last step (mean over ranks).",
              (Target(f"avg {by_job} ({m('trex_train_loss')}{{{SEL}}})", "{{job_name}}"),)),
        Panel("Step time", "Wall time of the last optimizer step (slowest rank).",
              (Target(f"max {by_job} ({m('trex_train_step_seconds')}{{{SEL}}})", "{{job_name}}"),), unit="s"),
        Panel("Expert-load imbalance (CV)", "Coefficient of variation of routed-expert load (0 = balanced).",
              (Target(f"max {by_job} ({m('trex_train_expert_load_cv')}{{{SEL}}})", "{{job_name}}"),)),
        Panel("Skipped steps and loss spikes", "Steps dropped by the NaN/Inf guard and detected loss spikes.",
              (Target(f"sum {by_job} (increase({m('trex_train_skipped_steps_total')}{{{SEL}}}[$__rate_interval]))",
                      "skipped {{job_name}}"),
               Target(f"sum {by_job} (increase({m('trex_train_spikes_total')}{{{SEL}}}[$__rate_interval]))",
                      "spikes {{job_name}}"))),
        Panel("Checkpoint age", "Seconds since the last verified checkpoint.",
              (Target(f"time() - max {by_job} ({m('trex_train_last_checkpoint_timestamp_seconds')}{{{SEL}}})",
                      "{{job_name}}"),), unit="s"),
        Panel("Swap optimizer: exposed copy time and overlap", "Optimizer-state copy time per step not hidden "
              "behind the bucket updates (slowest rank), and hidden / total copy time (worst rank, right axis).",
              (Target(f"max {by_job} ({m('trex_train_swap_exposed_seconds')}{{{SEL}}})", "exposed {{job_name}}"),
               Target(f"min {by_job} ({m('trex_train_swap_overlap_ratio')}{{{SEL}}})", "overlap {{job_name}}")),
              unit="s", right_axis={"B": "percentunit"}),
        Panel("Swap optimizer: device bytes saved", "Optimizer-state bytes in host memory minus the device bucket "
              "buffers (smallest rank).",
              (Target(f"min {by_job} ({m('trex_train_swap_device_bytes_saved')}{{{SEL}}})", "{{job_name}}"),),
              unit="bytes"),
        Panel("Distillation: reverse KL per teacher and student entropy", "Mean KL(student || teacher) per response "
              "token of the last step, per teacher, and the student's mean entropy (right axis).",
              (Target(f"max by ({JOB_LABEL}, teacher) ({m('trex_train_opd_kl')}{{{SEL}}})",
                      "KL {{job_name}} {{teacher}}"),
               Target(f"max {by_job} ({m('trex_train_opd_student_entropy')}{{{SEL}}})", "entropy {{job_name}}")),
              right_axis={"B": "short"}),
        Panel("Distillation: teacher cache and switches", "Teacher hidden-state bytes per second served from "
              "memory and spilled to disk, and teacher-head changes per step (right axis).",
              (Target(f"sum {by_job} (rate({m('trex_train_opd_cache_hit_bytes_total')}{{{SEL}}}[$__rate_interval]))",
                      "hit {{job_name}}"),
               Target(f"sum {by_job} (rate({m('trex_train_opd_cache_spilled_bytes_total')}{{{SEL}}}"
                      "[$__rate_interval]))", "spilled {{job_name}}"),
               Target(f"max {by_job} ({m('trex_train_opd_teacher_switches')}{{{SEL}}})", "switches {{job_name}}")),
              unit="Bps", right_axis={"C": "short"}),
        Panel("GRPO: reward", "Mean verifier reward of each step's responses and its standard deviation (right "
              "axis), over the ranks of each job.",
              (Target(f"avg {by_job} ({m('trex_train_reward_mean')}{{{SEL}}})", "mean {{job_name}}"),
               Target(f"avg {by_job} ({m('trex_train_reward_std')}{{{SEL}}})", "std {{job_name}}")),
              right_axis={"B": "short"}),
        Panel("GRPO: KL to the reference and clip fraction", "Mean k3 KL of the policy to the frozen reference over "
              "response tokens, and the share of tokens whose importance ratio was clipped (right axis).",
              (Target(f"avg {by_job} ({m('trex_train_kl')}{{{SEL}}})", "KL {{job_name}}"),
               Target(f"avg {by_job} ({m('trex_train_clip_fraction')}{{{SEL}}})", "clipped {{job_name}}")),
              right_axis={"B": "percentunit"}),
        Panel("GRPO: verifier outcomes", "Scored responses per second by verifier outcome (correct, wrong "
              "objective, no solver call, no code, ...).",
              (Target(f"sum by (outcome) (rate({m('trex_train_verifier_outcomes_total')}{{{SEL}}}"
                      "[$__rate_interval]))", "{{outcome}}"),), unit="ops", stacked=True),
        Panel("GRPO: step time split and response length", "Rollout, verification and loss time of the last step "
              "(slowest rank), and the mean response length in tokens (right axis).",
              (Target(f"max {by_job} ({m('trex_train_rollout_seconds')}{{{SEL}}})", "rollout {{job_name}}"),
               Target(f"max {by_job} ({m('trex_train_verify_seconds')}{{{SEL}}})", "verify {{job_name}}"),
               Target(f"max {by_job} ({m('trex_train_rl_train_seconds')}{{{SEL}}})", "train {{job_name}}"),
               Target(f"avg {by_job} ({m('trex_train_response_length')}{{{SEL}}})", "length {{job_name}}")),
              unit="s", right_axis={"D": "short"}),
        Panel("Restarts by cause", "Gang restarts in the selected range, by job kind and cause (operator).",
              (Target(f"sum by (kind, cause) (increase({m('trex_operator_restarts_total')}[$__range]))",
                      "{{kind}} {{cause}}", instant=True),), kind="bargauge"),
        Panel("ORData outcomes by reason", "Instances per second by pipeline outcome (accepted or rejection reason).",
              (Target(f"sum by (outcome) (rate({m('trex_ordata_samples_total')}{{{SEL}}}[$__rate_interval]))",
                      "{{outcome}}"),), unit="ops", stacked=True),
        Panel("ORData acceptance rate", "Share of processed instances that were accepted.",
              (Target(f"sum {by_job} (rate({m('trex_ordata_samples_total')}{{{SEL}, outcome=\"accepted\"}}"
                      f"[$__rate_interval])) / sum {by_job} (rate({m('trex_ordata_samples_total')}{{{SEL}}}"
                      f"[$__rate_interval]))", "{{job_name}}"),), unit="percentunit"),
        Panel("Kernel speedups", "Verified speedup of the best variant over the baseline.",
              (Target(f"max by (kernel, shape, dtype, device, baseline) ({m('trex_kernel_speedup')}{{{SEL}}})",
                      "{{kernel}} {{shape}} {{dtype}} {{device}} vs {{baseline}}", instant=True),),
              unit="x", kind="bargauge"),
        Panel("Pass@1 per benchmark", "Unbiased pass@1 per benchmark and protocol. The eval pod serves its final "
              "gauges for one scrape before it exits, so each series may hold a single sample: last_over_time "
              "over the step shows it at whatever step the range query lands on.",
              (Target(f"max by (benchmark, protocol) (last_over_time({m('trex_eval_pass_at_k')}{{{SEL}, k=\"1\"}}"
                      "[$__interval]))",
                      "{{benchmark}} ({{protocol}})"),), unit="percentunit"),
        Panel("Pass@1 per EvalJob", "Each EvalJob's Pass@1 per benchmark from its status (the operator exports "
              "it while the job exists, long after the eval pod is gone).",
              (Target(f"max by ({JOB_LABEL}, benchmark) ({m('trex_job_pass_at_1')}{{{SEL}}})",
                      "{{job_name}} {{benchmark}}", instant=True),), unit="percentunit", kind="bargauge"),
        Panel("Speedups per KernelTuneJob", "Each KernelTuneJob's verified speedup per kernel/dtype and their "
              "geomean, from its status.",
              (Target(f"max by ({JOB_LABEL}, kernel) ({m('trex_job_kernel_speedup')}{{{SEL}}})",
                      "{{job_name}} {{kernel}}", instant=True),), unit="x", kind="bargauge"),
        Panel("Accepted samples per ORDataJob", "Each ORDataJob's accepted samples after the merge, from its status.",
              (Target(f"max {by_job} ({m('trex_job_accepted_samples')}{{{SEL}}})", "{{job_name}}", instant=True),),
              kind="bargauge"),
        Panel("Final MFU and loss per TrainJob", "Each TrainJob's final MFU and loss (right axis), from its status.",
              (Target(f"max {by_job} ({m('trex_job_mfu')}{{{SEL}}})", "MFU {{job_name}}"),
               Target(f"max {by_job} ({m('trex_job_loss')}{{{SEL}}})", "loss {{job_name}}")),
              unit="percentunit", right_axis={"B": "none"}),
        Panel("Jobs by phase", "trex jobs by kind and phase (operator).",
              (Target(f"sum by (kind, phase) ({m('trex_operator_jobs')})", "{{kind}} {{phase}}"),), stacked=True),
        Panel("Reconcile latency p95", "95th percentile of the operator's reconciliation time.",
              (Target("histogram_quantile(0.95, sum by (le, kind) "
                      f"(rate({m('trex_operator_reconcile_seconds_bucket')}[$__rate_interval])))", "{{kind}}"),),
              unit="s"),
    ]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2,
        "includeAll": True, "multi": True, "allValue": ".*", "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def variables() -> list[dict[str, Any]]:
    """Template variables: datasource, namespace and job (the job_name label)."""
    ds = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
          "current": {}, "refresh": 1}
    sel = f'{{__name__=~"{WORKLOAD_METRICS_RE}"}}'
    job_sel = f'{{__name__=~"{WORKLOAD_METRICS_RE}", namespace=~"$namespace"}}'
    return [ds, _variable("namespace", "Namespace", f"label_values({sel}, namespace)"),
            _variable("job", "Job", f"label_values({job_sel}, {JOB_LABEL})")]


def _panel_json(p: Panel, pid: int, x: int, y: int, height: int) -> dict[str, Any]:
    refs = [chr(ord("A") + i) for i in range(len(p.targets))]
    targets = [{"datasource": DATASOURCE, "refId": r, "expr": t.expr, "legendFormat": t.legend,
                "range": not t.instant, "instant": t.instant} for r, t in zip(refs, p.targets, strict=True)]
    overrides = [{"matcher": {"id": "byFrameRefID", "options": ref},
                  "properties": [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": "right"}]}
                 for ref, unit in sorted(p.right_axis.items())]
    custom: dict[str, Any] = {}
    if p.kind == "timeseries":
        custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if p.stacked else 0,
                  "stacking": {"mode": "normal" if p.stacked else "none", "group": "A"}}
    options: dict[str, Any] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                               "tooltip": {"mode": "multi", "sort": "desc"}}
    if p.kind == "bargauge":
        options = {"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                   "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return {"id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DATASOURCE,
            "gridPos": {"h": height, "w": p.width, "x": x, "y": y}, "targets": targets,
            "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": overrides},
            "options": options}


def dashboard() -> dict[str, Any]:
    """The whole dashboard JSON model (Grafana schemaVersion 39)."""
    out: list[dict[str, Any]] = []
    x = y = 0
    height = 8
    for pid, p in enumerate(panels(), start=1):
        if x + p.width > 24:
            x, y = 0, y + height
        out.append(_panel_json(p, pid, x, y, height))
        x += p.width
    return {
        "uid": UID, "title": "trex", "description": "trex jobs: training MFU and loss, kernels, OR data, evaluation.",
        "tags": ["trex"], "timezone": "browser", "editable": True, "graphTooltip": 1, "refresh": "30s",
        "schemaVersion": 39, "version": 1, "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables()}, "annotations": {"list": []}, "links": [], "panels": out,
    }


def dashboard_json() -> str:
    """The dashboard as the exact text checked in at charts/trex/dashboards/trex.json."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def dashboard_exprs(model: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard JSON model (panel targets)."""
    return [str(t["expr"]) for p in model.get("panels", []) for t in p.get("targets", [])]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana template variables ($name or ${name}) in ``expr``; unknown names are an error."""
    def repl(mt: re.Match[str]) -> str:
        name = mt.group(1) or mt.group(2)
        if name not in values:
            raise KeyError(f"template variable ${name} has no value")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


# --- alert rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """An alert threshold: its key under .Values.alerts in the chart and its default."""

    key: str
    default: str
    doc: str


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold("mfuDropShare", "0.2", "Fire when MFU falls below (1 - share) x its 1 h median."),
    Threshold("mfuDropFor", "10m", "How long the MFU drop must last."),
    Threshold("stallMinutes", "15", "Fire when trex_train_step has not advanced for this many minutes."),
    Threshold("passAt1Drop", "0.05", "Fire when Pass@1 falls by more than this (absolute) against the reference."),
    Threshold("passAt1Offset", "1d", "Reference point for Pass@1: the best value in the window ending this long ago."),
    Threshold("passAt1Window", "7d", "Length of the reference window for Pass@1."),
    Threshold("failedFor", "1m", "How long a failed TrainJob must be present before alerting."),
)
DEFAULTS: dict[str, str] = {t.key: t.default for t in THRESHOLDS}


def helm_params() -> dict[str, str]:
    """Threshold values as Helm expressions over .Values.alerts (for the chart's generated rule file)."""
    return {t.key: f"{{{{ .Values.alerts.{t.key} }}}}" for t in THRESHOLDS}


def _runbook(anchor: str, base: str) -> str:
    return f"{base}#{anchor}"


def alert_rules(params: Mapping[str, str], runbook_base: str, *, helm: bool = False) -> list[dict[str, Any]]:
    """Prometheus rule groups; ``params`` holds a value (or Helm expression) for every threshold key.

    With ``helm=True`` the Prometheus template braces in annotations are escaped for Helm's ``tpl``.
    """
    missing = [t.key for t in THRESHOLDS if t.key not in params]
    if missing:
        raise KeyError(f"alert thresholds missing: {', '.join(missing)}")
    p = params

    def ann(summary: str, description: str, anchor: str) -> dict[str, str]:
        """Annotations; Prometheus templates are escaped for Helm, then @key@ tokens become thresholds."""
        def fill(s: str) -> str:
            if helm:
                s = re.sub(r"\{\{(.*?)\}\}", r"{{`{{\1}}`}}", s)
            return re.sub(r"@(\w+)@", lambda mt: p[mt.group(1)], s)

        return {"summary": fill(summary), "description": fill(description),
                "runbook_url": _runbook(anchor, runbook_base)}

    mfu = m("trex_train_mfu")
    step = m("trex_train_step")
    pass_k = m("trex_eval_pass_at_k")
    rules: list[dict[str, Any]] = [
        {"alert": "TrexTrainJobFailed",
         "expr": f'sum({m("trex_operator_jobs")}{{kind="TrainJob", phase="Failed"}}) > 0',
         "for": p["failedFor"], "labels": {"severity": "critical"},
         "annotations": ann("{{ $value }} TrainJob(s) failed",
                            "At least one TrainJob is in phase Failed; its status.reason and Events say why.",
                            "trextrainjobfailed")},
        {"alert": "TrexMFUDropped",
         "expr": f"{mfu} < (1 - {p['mfuDropShare']}) * quantile_over_time(0.5, {mfu}[1h])",
         "for": p["mfuDropFor"], "labels": {"severity": "warning"},
         "annotations": ann("MFU of {{ $labels.job_name }} dropped",
                            "MFU of {{ $labels.job_name }} (rank {{ $labels.rank }}) is {{ $value | humanizePercentage }}, "
                            "more than @mfuDropShare@ below its 1 h median.",
                            "trexmfudropped")},
        {"alert": "TrexTrainingStalled",
         "expr": f"changes({step}[{p['stallMinutes']}m]) == 0 and {step} < {m('trex_train_max_steps')}",
         "for": "1m", "labels": {"severity": "warning"},
         "annotations": ann("{{ $labels.job_name }} makes no progress",
                            "trex_train_step of {{ $labels.job_name }} has not advanced for @stallMinutes@ minutes.",
                            "trextrainingstalled")},
        {"alert": "TrexPassAt1Regressed",
         "expr": (f'max by (benchmark, protocol) (last_over_time({pass_k}{{k="1"}}[1h])) < max by (benchmark, protocol) '
                  f'(max_over_time({pass_k}{{k="1"}}[{p["passAt1Window"]}] offset {p["passAt1Offset"]})) '
                  f'- {p["passAt1Drop"]}'),
         "for": "0m", "labels": {"severity": "warning"},
         "annotations": ann("Pass@1 on {{ $labels.benchmark }} regressed",
                            "Pass@1 on {{ $labels.benchmark }} ({{ $labels.protocol }}) is {{ $value }}, "
                            "more than @passAt1Drop@ below the best value of the reference window.",
                            "trexpassat1regressed")},
    ]
    return [{"name": "trex.rules", "rules": rules}]


def alert_exprs(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every PromQL expression in rule groups."""
    return [str(r["expr"]) for g in groups for r in g["rules"]]


HELM_RUNBOOK_BASE = "{{ .Values.alerts.runbookBaseUrl }}"


def alerts_file_text() -> str:
    """The chart's files/alerts.yaml: rule groups with Helm expressions for thresholds (rendered via tpl)."""
    import yaml

    body = yaml.safe_dump(alert_rules(helm_params(), HELM_RUNBOOK_BASE, helm=True), sort_keys=False, width=1000)
    return "# Generated by `python -m trex.telemetry.dashboard`; do not edit.\n" + body


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or --check) the dashboard JSON and the chart's alert rule file."""
    ap = argparse.ArgumentParser(prog="python -m trex.telemetry.dashboard", description=main.__doc__)
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD_PATH, help="dashboard JSON path")
    ap.add_argument("--alerts", type=Path, default=ALERTS_PATH, help="chart alert rules path")
    ap.add_argument("--check", action="store_true", help="exit 1 when the files differ from the generated text")
    args = ap.parse_args(argv)
    stale = []
    for path, text in ((args.dashboard, dashboard_json()), (args.alerts, alerts_file_text())):
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python -m trex.telemetry.dashboard):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The chart's alert rules, rendered by helm with default thresholds, fire (and stay quiet) as
documented in docs/runbooks.md: checked by Prometheus's own rule unit-test runner (`promtool test rules`)
on synthetic series whose expected outcome follows from the thresholds by hand."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
HELM = REPO / ".venv" / "bin" / "helm"
RUNBOOKS = "https://github.com/trex-dev/trex/blob/main/docs/runbooks.md"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        msg = ("\n!! promtool is NOT installed: the alert behaviour test is SKIPPED. "
               "Install the Debian package: apt-get install -y prometheus\n")
        print(msg, file=sys.stderr)
        warnings.warn(msg, stacklevel=2)
        pytest.skip("promtool binary absent (Debian package prometheus not installed)")
    return path


def _rules(tmp: Path) -> Path:
    if not HELM.is_file():
        pytest.skip("helm binary missing at .venv/bin/helm (run `make`); alert behaviour NOT tested")
    values = tmp / "values.yaml"
    values.write_text(yaml.safe_dump({"monitoring": {"prometheusRule": {"enabled": True}}}))
    out = subprocess.run([str(HELM), "template", "trex", str(REPO / "charts" / "trex"), "-f", str(values),
                          "-s", "templates/monitoring.yaml"], capture_output=True, text=True, check=True, timeout=60)
    (rule,) = [o for o in yaml.safe_load_all(out.stdout) if o and o["kind"] == "PrometheusRule"]
    path = tmp / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


MFU = 'trex_train_mfu{{job_name="{job}", rank="0", device="cpu", flops_convention="6N"}}'


def _mfu_alert(job: str, value: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": "warning", "job_name": job, "rank": "0", "device": "cpu",
                           "flops_convention": "6N"},
            "exp_annotations": {"summary": f"MFU of {job} dropped",
                                "description": f"MFU of {job} (rank 0) is {value}, more than 0.2 below its 1 h median.",
                                "runbook_url": f"{RUNBOOKS}#trexmfudropped"}}


# Defaults: mfuDropShare 0.2 for 10m; stallMinutes 15 (for 1m); passAt1Drop 0.05 vs the best of
# [7d] offset 1d; failedFor 1m.
TESTS: list[dict[str, Any]] = [
    {   # MFU 0.5 for an hour, then: job a drops to 0.3 (< 0.8 x median 0.5), job c to 0.45 (only 10 %).
        "interval": "1m",
        "input_series": [
            {"series": MFU.format(job="a"), "values": "0.5x60 0.3x30"},
            {"series": MFU.format(job="b"), "values": "0.5x90"},
            {"series": MFU.format(job="c"), "values": "0.5x60 0.45x30"},
        ],
        "alert_rule_test": [
            {"eval_time": "59m", "alertname": "TrexMFUDropped", "exp_alerts": []},
            {"eval_time": "65m", "alertname": "TrexMFUDropped", "exp_alerts": []},  # pending: for 10m
            {"eval_time": "75m", "alertname": "TrexMFUDropped", "exp_alerts": [_mfu_alert("a", "30%")]},
        ],
    },
    {   # Job s advances 10 steps then stops; job done reached maxSteps; job m keeps moving.
        "interval": "1m",
        "input_series": [
            {"series": 'trex_train_step{job_name="s"}', "values": "0+1x10 10x40"},
            {"series": 'trex_train_max_steps{job_name="s"}', "values": "100x50"},
            {"series": 'trex_train_step{job_name="done"}', "values": "0+5x10 50x40"},
            {"series": 'trex_train_max_steps{job_name="done"}', "values": "50x50"},
            {"series": 'trex_train_step{job_name="m"}', "values": "0+1x50"},
            {"series": 'trex_train_max_steps{job_name="m"}', "values": "100x50"},
        ],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "TrexTrainingStalled", "exp_alerts": []},
            {"eval_time": "40m", "alertname": "TrexTrainingStalled", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "job_name": "s"},
                "exp_annotations": {"summary": "s makes no progress",
                                    "description": "trex_train_step of s has not advanced for 15 minutes.",
                                    "runbook_url": f"{RUNBOOKS}#trextrainingstalled"}}]},
        ],
    },
    {   # Pass@1 of nl4opt falls 0.8 -> 0.7 (> 0.05 below the reference); mamo 0.6 -> 0.58 (within 0.05).
        "interval": "1h",
        "input_series": [
            {"series": 'trex_eval_pass_at_k{benchmark="nl4opt", k="1", protocol="zero-shot"}', "values": "0.8x200 0.7x10"},
            {"series": 'trex_eval_pass_at_k{benchmark="nl4opt", k="8", protocol="zero-shot"}', "values": "0.9x200 0.1x10"},
            {"series": 'trex_eval_pass_at_k{benchmark="mamo", k="1", protocol="zero-shot"}', "values": "0.6x200 0.58x10"},
        ],
        "alert_rule_test": [
            {"eval_time": "199h", "alertname": "TrexPassAt1Regressed", "exp_alerts": []},
            {"eval_time": "205h", "alertname": "TrexPassAt1Regressed", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "benchmark": "nl4opt", "protocol": "zero-shot"},
                "exp_annotations": {
                    "summary": "Pass@1 on nl4opt regressed",
                    "description": "Pass@1 on nl4opt (zero-shot) is 0.7, more than 0.05 below the best value "
                                   "of the reference window.",
                    "runbook_url": f"{RUNBOOKS}#trexpassat1regressed"}}]},
        ],
    },
    {   # One TrainJob turns Failed at minute 5; Running TrainJobs and failed EvalJobs do not count.
        "interval": "1m",
        "input_series": [
            {"series": 'trex_operator_jobs{kind="TrainJob", phase="Failed"}', "values": "0x5 1x10"},
            {"series": 'trex_operator_jobs{kind="TrainJob", phase="Running"}', "values": "3x15"},
            {"series": 'trex_operator_jobs{kind="EvalJob", phase="Failed"}', "values": "2x15"},
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "TrexTrainJobFailed", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "TrexTrainJobFailed", "exp_alerts": [{
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {
                    "summary": "1 TrainJob(s) failed",
                    "description": "At least one TrainJob is in phase Failed; its status.reason and Events say why.",
                    "runbook_url": f"{RUNBOOKS}#trextrainjobfailed"}}]},
        ],
    },
]


def test_alert_rules_fire_as_documented(tmp_path: Path) -> None:
    promtool = _promtool()
    rules = _rules(tmp_path)
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # Minute-scale scenarios are evaluated every minute, the week-scale Pass@1 one every hour.
    specs = []
    for name, interval in (("minutes.yml", "1m"), ("hours.yml", "1h")):
        tests = [t for t in TESTS if t["interval"] == interval]
        (tmp_path / name).write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": interval,
                                                     "tests": tests}))
        specs.append(name)
    res = subprocess.run([promtool, "test", "rules", *specs], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == 2, res.stdout


def test_promtool_runner_can_fail(tmp_path: Path) -> None:
    # The same runner reports a wrong expectation (guards against a test that cannot fail).
    promtool = _promtool()
    rules = _rules(tmp_path)
    wrong = [dict(TESTS[1], alert_rule_test=[{"eval_time": "40m", "alertname": "TrexTrainingStalled", "exp_alerts": []}])]
    spec = tmp_path / "tests.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": wrong}))
    res = subprocess.run([promtool, "test", "rules", spec.name], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0
    assert "TrexTrainingStalled" in res.stdout + res.stderr

"""Monitoring end to end with a real Prometheus: a tiny `trex train` exports metrics, Prometheus
scrapes it every second, and the dashboard's MFU query returns exactly the MFU the trainer logged.
The chart's alert rules load into the same Prometheus and behave as specified under `promtool test rules`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.telemetry import dashboard as d

REPO = Path(__file__).resolve().parents[3]
HELM = REPO / ".venv" / "bin" / "helm"
TREX = Path(sys.executable).parent / "trex"
JOB = "monitoring-e2e"
NAMESPACE = "team-a"
RANK = "0"


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        msg = (f"\n{'!' * 78}\n!! {binary} is NOT installed: the monitoring end-to-end test is SKIPPED.\n"
               f"!! Install the Debian package: apt-get install -y prometheus (the Makefile's `prometheus` target).\n"
               f"{'!' * 78}")
        print(msg, file=sys.stderr)
        warnings.warn(msg, stacklevel=2)
        pytest.skip(f"{binary} binary absent (Debian package prometheus not installed)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(what: str, fn: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _rendered_rules(tmp: Path) -> dict[str, Any]:
    """The alert rule groups exactly as the chart renders them (default thresholds)."""
    if not HELM.is_file():
        pytest.skip("helm binary missing at .venv/bin/helm (run `make`); rule loading NOT tested")
    values = tmp / "values.yaml"
    values.write_text(yaml.safe_dump({"monitoring": {"prometheusRule": {"enabled": True}}}))
    out = subprocess.run([str(HELM), "template", "trex", str(REPO / "charts" / "trex"), "-f", str(values),
                          "-s", "templates/monitoring.yaml"], capture_output=True, text=True, check=True, timeout=60)
    (rule,) = [o for o in yaml.safe_load_all(out.stdout) if o and o["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


class Prometheus:
    """A Prometheus server on 127.0.0.1 with a temporary data dir, stopped on exit."""

    def __init__(self, binary: str, tmp: Path, scrape_port: int, rules: Path) -> None:
        self.port = _free_port()
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{
                "job_name": "trex-workloads",
                "static_configs": [{"targets": [f"127.0.0.1:{scrape_port}"],
                                    # What the chart's PodMonitor relabelings add in a cluster.
                                    "labels": {"namespace": NAMESPACE, "rank": RANK, "job_kind": "TrainJob"}}],
            }],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.log = (tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        _wait("prometheus ready", lambda: urllib.request.urlopen(f"{self.base}/-/ready", timeout=2).status == 200,
              60, self.proc)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": repr(at)} if at is not None else {})
        res = _get(f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}")
        assert res["status"] == "success", res
        return list(res["data"]["result"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_binary() -> str:
    return _require("prometheus")


@pytest.fixture
def trainer_port() -> int:
    return _free_port()


@pytest.fixture
def prom(prometheus_binary: str, tmp_path: Path, trainer_port: int) -> Iterator[Prometheus]:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(_rendered_rules(tmp_path)))
    p = Prometheus(prometheus_binary, tmp_path, trainer_port, rules)
    try:
        yield p
    finally:
        p.stop()


def _train_config(tmp: Path, port: int) -> Path:
    cfg = {"trainer": {
        "model": {"preset": "tiny"}, "maxSteps": 100_000, "seed": 0,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 100_000},
        "logging": {"intervalSteps": 1, "jsonl": str(tmp / "metrics.jsonl"), "metricsPort": port},
    }}
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_dashboard_mfu_query_returns_the_logged_mfu(prom: Prometheus, tmp_path: Path, trainer_port: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", TREX_JOB_NAME=JOB)
    env.pop("TREX_METRICS_PORT", None)
    log = (tmp_path / "train.log").open("wb")
    trainer = subprocess.Popen([str(TREX), "train", "--config", str(_train_config(tmp_path, trainer_port))],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Let Prometheus scrape a few training steps, then stop the trainer (SIGTERM: final checkpoint, exit 143).
        _wait("three scraped MFU samples",
              lambda: prom.query(f'count_over_time(trex_train_mfu{{job_name="{JOB}"}}[5m]) >= 3'), 150, trainer)
    finally:
        trainer.send_signal(signal.SIGTERM)
        try:
            rc = trainer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            trainer.kill()
            rc = trainer.wait()
        log.close()
    assert rc in (0, 143), (tmp_path / "train.log").read_text()[-2000:]

    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    mfu_by_step = {int(r["step"]): float(r["mfu"]) for r in logged}
    assert mfu_by_step, "the trainer logged no steps"

    # The raw samples Prometheus stored: (timestamp, value) of the MFU and step gauges.
    (raw_mfu,) = prom.query(f'trex_train_mfu{{job_name="{JOB}"}}[10m]')
    (raw_step,) = prom.query(f'trex_train_step{{job_name="{JOB}"}}[10m]')
    steps_at = {float(ts): int(float(v)) for ts, v in raw_step["values"]}
    ts, scraped = raw_mfu["values"][-1]
    ts = float(ts)
    assert raw_mfu["metric"]["device"] and raw_mfu["metric"]["flops_convention"]

    # The dashboard's MFU panel query, with its template variables substituted as Grafana would.
    (mfu_panel,) = [p for p in d.dashboard()["panels"] if p["title"] == "MFU per job and rank"]
    mfu_expr = next(t["expr"] for t in mfu_panel["targets"] if "trex_train_mfu" in t["expr"])
    expr = d.substitute(mfu_expr, {"namespace": NAMESPACE, "job": JOB})
    (answer,) = prom.query(expr, at=ts)
    assert answer["metric"]["job_name"] == JOB and answer["metric"]["rank"] == RANK
    value = float(answer["value"][1])
    assert value == float(scraped)

    # The value is exactly (bit for bit) the MFU the trainer logged for the step it had reached. The
    # step gauge is set just before the MFU gauge, so a scrape can fall between the two: then the MFU
    # is still the previous step's.
    step = steps_at[ts]
    assert value in (mfu_by_step.get(step), mfu_by_step.get(step - 1)), (value, step, mfu_by_step.get(step))
    assert 0.0 < value < 1.0

    # The peak FLOP/s series the MFU is computed against is on the same panel, for the same rank.
    peak_expr = d.substitute(next(t["expr"] for t in mfu_panel["targets"] if "peak_flops" in t["expr"]),
                             {"namespace": NAMESPACE, "job": JOB})
    (peak,) = prom.query(peak_expr, at=ts)
    assert float(peak["value"][1]) > 0 and peak["metric"]["rank"] == RANK

    # The chart's alert rules loaded into this Prometheus and evaluate without errors.
    def rules_evaluated() -> list[dict[str, Any]]:
        groups = _get(f"{prom.base}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else []

    rules = _wait("alert rules evaluated", rules_evaluated, 30)
    assert {r["name"] for r in rules} == {"TrexTrainJobFailed", "TrexMFUDropped", "TrexTrainingStalled",
                                          "TrexPassAt1Regressed"}

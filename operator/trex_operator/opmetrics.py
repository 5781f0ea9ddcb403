"""The operator's own Prometheus metrics on a private registry: trex_operator_* (reconciles, phases,
restarts) and trex_job_* (each job's final results from its status, exported while the job exists, so a
batch job's Pass@1 or speedup stays visible after its pod is gone)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trex.telemetry.metrics import METRICS

RESTART_CAUSES = ("failure", "oomKilled", "preempted", "evicted", "nodeLost", "specChanged")
"""The causes of gang restarts (trex_operator.lifecycle / engine): their counters start at 0, so the
dashboard's restarts panel shows zeros rather than no data while nothing has restarted."""
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Reconciles by kind/result, reconcile latency, jobs by kind/phase, restarts by cause."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        m: dict[str, Any] = {}
        for spec in METRICS:
            if not spec.name.startswith(("trex_operator_", "trex_job_")):
                continue
            name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            if spec.kind == "counter":
                m[spec.name] = Counter(name, spec.help, list(spec.labels), registry=self.registry)
            elif spec.kind == "gauge":
                m[spec.name] = Gauge(name, spec.help, list(spec.labels), registry=self.registry)
            else:
                m[spec.name] = Histogram(name, spec.help, list(spec.labels), registry=self.registry, buckets=BUCKETS)
        self._m = m
        from trex_operator.api import KIND_INFO

        for kind in KIND_INFO:
            for cause in RESTART_CAUSES:
                m["trex_operator_restarts_total"].labels(kind=kind, cause=cause)
        self._phases: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._results: dict[tuple[str, str, str], dict[tuple[str, tuple[str, ...]], float]] = {}
        self.port: int | None = None

    def reconciled(self, kind: str, result: str, seconds: float) -> None:
        """Count one reconciliation and observe its latency."""
        self._m["trex_operator_reconciles_total"].labels(kind=kind, result=result).inc()
        self._m["trex_operator_reconcile_seconds"].labels(kind=kind).observe(seconds)

    def restarted(self, kind: str, cause: str) -> None:
        """Count a gang restart."""
        self._m["trex_operator_restarts_total"].labels(kind=kind, cause=cause).inc()

    def job_phase(self, key: tuple[str, str, str], phase: str | None) -> None:
        """Track the phase of one job (None = gone) and refresh the jobs-by-phase gauge."""
        gauge = self._m["trex_operator_jobs"]
        old = self._phases.pop(key, None)
        if phase is not None:
            self._phases[key] = (key[0], phase)
        if old is not None and old != self._phases.get(key):
            gauge.labels(kind=old[0], phase=old[1]).set(sum(1 for v in self._phases.values() if v == old))
        if phase is not None:
            gauge.labels(kind=key[0], phase=phase).set(sum(1 for v in self._phases.values() if v == (key[0], phase)))

    def job_results(self, key: tuple[str, str, str], status: Mapping[str, Any] | None) -> None:
        """Export the results in one job's status (None = the job is gone: its series are removed)."""
        new = result_samples(key, status) if status is not None else {}
        for (name, labels) in set(self._results.get(key, {})) - set(new):
            self._m[name].remove(*labels)
        for (name, labels), value in new.items():
            self._m[name].labels(*labels).set(value)
        if new:
            self._results[key] = new
        else:
            self._results.pop(key, None)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics; returns the bound port (0 picks a free one)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(server.server_address[1])
        return self.port

    def exposition(self) -> str:
        """The current text exposition (for tests and debugging)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def result_samples(key: tuple[str, str, str], status: Mapping[str, Any]) -> dict[tuple[str, tuple[str, ...]], float]:
    """The trex_job_* samples a job's ``status.results`` gives: {(metric, label values): value}; label
    values are (job_kind, job_name, namespace[, benchmark or kernel]). ``key`` is (kind, namespace, name)."""
    kind, namespace, name = key
    base = (kind, name, namespace)
    raw = status.get("results")
    results: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    out: dict[tuple[str, tuple[str, ...]], float] = {}

    def put(metric: str, value: Any, *extra: str) -> None:
        number = _number(value)
        if number is not None:
            out[(metric, (*base, *extra))] = number

    if kind == "EvalJob":
        for bench, r in (results.get("benchmarks") or {}).items():
            put("trex_job_pass_at_1", (r or {}).get("passAt1") if isinstance(r, Mapping) else None, str(bench))
    elif kind == "ORDataJob":
        put("trex_job_accepted_samples", results.get("accepted"))
    elif kind == "KernelTuneJob":
        put("trex_job_kernel_speedup", results.get("geomeanSpeedup"), "geomean")
        for kernel, r in (results.get("kernels") or {}).items():
            put("trex_job_kernel_speedup", (r or {}).get("speedup") if isinstance(r, Mapping) else None, str(kernel))
    elif kind == "TrainJob":
        put("trex_job_mfu", results.get("mfu"))
        put("trex_job_loss", results.get("loss"))
    return out

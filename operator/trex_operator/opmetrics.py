"""The operator's own Prometheus metrics (trex_operator_* from trex.telemetry.metrics) on a private registry."""

from __future__ import annotations

from typing import Any

from trex.telemetry.metrics import METRICS

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Reconciles by kind/result, reconcile latency, jobs by kind/phase, restarts by cause."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        m: dict[str, Any] = {}
        for spec in METRICS:
            if not spec.name.startswith("trex_operator_"):
                continue
            name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            if spec.kind == "counter":
                m[spec.name] = Counter(name, spec.help, list(spec.labels), registry=self.registry)
            elif spec.kind == "gauge":
                m[spec.name] = Gauge(name, spec.help, list(spec.labels), registry=self.registry)
            else:
                m[spec.name] = Histogram(name, spec.help, list(spec.labels), registry=self.registry, buckets=BUCKETS)
        self._m = m
        self._phases: dict[tuple[str, str, str], tuple[str, str]] = {}
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

"""Prometheus exporter: creates the metrics named in :mod:`trex.telemetry.metrics` on a private registry."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from trex.telemetry.metrics import spec

FINAL_SCRAPE_WAIT_S = 30.0
"""How long a finished batch workload keeps serving for one more scrape of its final values (Prometheus'
usual intervals are 15-30 s; a pod that exits first takes its last results with it)."""


class _ScrapeClock:
    """A collector that yields nothing and records when the registry was last scraped."""

    def __init__(self) -> None:
        self.last = 0.0
        self.cond = threading.Condition()

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        with self.cond:
            self.last = time.monotonic()
            self.cond.notify_all()
        return []


class Exporter:
    """One private registry; a metric is created (and exported) on first use, so each workload exports
    only the metrics it sets (no idle zeros of other workloads' gauges). ``serve`` starts the endpoint."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self._m: dict[str, Any] = {}
        self.port: int | None = None
        self._clock = _ScrapeClock()
        self.registry.register(self._clock)

    def metric(self, name: str, **labels: str) -> Any:
        """The metric (or its labelled child) for ``name``, created on first use."""
        m = spec(name)
        metric = self._m.get(name)
        if metric is None:
            from prometheus_client import Counter, Gauge, Histogram

            # prometheus_client appends _total to counters itself.
            base = m.name[: -len("_total")] if m.kind == "counter" and m.name.endswith("_total") else m.name
            cls = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}[m.kind]
            metric = self._m[name] = cls(base, m.help, list(m.labels), registry=self.registry)
        return metric.labels(**labels) if labels else metric

    def serve(self, port: int | None = None, addr: str | None = None) -> int:
        """Serve /metrics on ``port`` (None: TREX_METRICS_PORT; 0 picks a free port) at ``addr`` (None:
        TREX_METRICS_ADDR, else all interfaces). Returns the port."""
        from prometheus_client import start_http_server

        if port is None:
            port = int(os.environ.get("TREX_METRICS_PORT", "0"))
        if addr is None:
            addr = os.environ.get("TREX_METRICS_ADDR") or "0.0.0.0"
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(server.server_address[1])
        return self.port

    def wait_for_scrape(self, timeout_s: float = FINAL_SCRAPE_WAIT_S) -> bool:
        """When serving: block until the endpoint is scraped once more (so final values reach Prometheus)
        or ``timeout_s`` passes; True when a scrape came. Not serving: returns False at once."""
        if self.port is None:
            return False
        start = time.monotonic()
        with self._clock.cond:
            return self._clock.cond.wait_for(lambda: self._clock.last > start, timeout=timeout_s)

    def render(self) -> str:
        """Text exposition of the current values."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

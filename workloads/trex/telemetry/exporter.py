"""Prometheus exporter: creates the metrics named in :mod:`trex.telemetry.metrics` on a private registry."""

from __future__ import annotations

import os
from typing import Any

from trex.telemetry.metrics import METRICS, spec


class Exporter:
    """Holds one registry with every defined metric; ``serve`` starts the HTTP endpoint."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._m: dict[str, Any] = {}
        for m in METRICS:
            # prometheus_client appends _total to counters itself.
            name = m.name[: -len("_total")] if m.kind == "counter" and m.name.endswith("_total") else m.name
            cls = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}[m.kind]
            self._m[m.name] = cls(name, m.help, list(m.labels), registry=self.registry)
        self.port: int | None = None

    def metric(self, name: str, **labels: str) -> Any:
        """The metric (or its labelled child) for ``name``."""
        spec(name)
        metric = self._m[name]
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

    def render(self) -> str:
        """Text exposition of the current values."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

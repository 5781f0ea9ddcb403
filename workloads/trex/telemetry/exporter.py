"""Prometheus exporter: creates the metrics named in :mod:`trex.telemetry.metrics` on a private registry."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from trex.telemetry.metrics import spec

FINAL_SCRAPE_WAIT_S = 30.0
"""How long a finished batch workload keeps serving for one more scrape of its final values (Prometheus'
usual intervals are 15-30 s; a pod that exits first takes its last results with it)."""


class _ScrapeClock:
    """When the last scrape's response had been written to the scraper's socket (not merely generated: a
    process that exits between the two loses that scrape, and Prometheus records the target as down)."""

    def __init__(self) -> None:
        self.last = 0.0
        self.cond = threading.Condition()

    def mark(self) -> None:
        with self.cond:
            self.last = time.monotonic()
            self.cond.notify_all()


class _Sent:
    """A WSGI response body whose ``close`` (called by the server after the last byte went out) marks the clock."""

    def __init__(self, body: Iterable[bytes], clock: _ScrapeClock) -> None:
        self.body = body
        self.clock = clock

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        self.clock.mark()


class Exporter:
    """One private registry; a metric is created (and exported) on first use, so each workload exports
    only the metrics it sets (no idle zeros of other workloads' gauges). ``serve`` starts the endpoint."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self._m: dict[str, Any] = {}
        self.port: int | None = None
        self._clock = _ScrapeClock()

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
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        if port is None:
            port = int(os.environ.get("TREX_METRICS_PORT", "0"))
        host = addr if addr is not None else os.environ.get("TREX_METRICS_ADDR") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        metrics = make_wsgi_app(self.registry)
        clock = self._clock

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            body: Iterable[bytes] = metrics(environ, start_response)
            return _Sent(body, clock) if environ.get("PATH_INFO") != "/favicon.ico" else body

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Log nothing."""

        class Server(ThreadingWSGIServer):
            address_family = family

        server = make_server(host, port, app, Server, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        self.port = int(server.server_address[1])
        return self.port

    def wait_for_scrape(self, timeout_s: float = FINAL_SCRAPE_WAIT_S) -> bool:
        """When serving: block until a scrape's response has been sent once more (so final values reach
        Prometheus) or ``timeout_s`` passes; True when one was. Not serving: returns False at once."""
        if self.port is None:
            return False
        start = time.monotonic()
        with self._clock.cond:
            return self._clock.cond.wait_for(lambda: self._clock.last > start, timeout=timeout_s)

    def render(self) -> str:
        """Text exposition of the current values."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

"""Telemetry shared by every workload: metric names, Prometheus exporter, progress, logs, summaries."""

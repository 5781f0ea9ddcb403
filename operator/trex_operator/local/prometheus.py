"""A local Prometheus (the Debian/upstream `prometheus` binary) on 127.0.0.1 for `trex demo`.

It scrapes every second: the running pods' metrics endpoints from a file_sd targets file (the local
kubelet rewrites it as pods start and stop) and the operator's own /metrics from a static target.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


def find_binary() -> str | None:
    """Path of the `prometheus` binary (None when it is not installed)."""
    return shutil.which("prometheus")


def scrape_config(targets_file: Path, operator_target: str | None, interval_s: float = 1.0) -> str:
    """prometheus.yml text: pods via file_sd (``targets_file``), the operator as a static target."""
    interval = f"{max(1, round(interval_s))}s"
    jobs: list[dict[str, Any]] = [{
        "job_name": "trex-pods", "scrape_interval": interval, "scrape_timeout": interval,
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": interval}],
    }]
    if operator_target:
        jobs.append({"job_name": "trex-operator", "scrape_interval": interval, "scrape_timeout": interval,
                     "static_configs": [{"targets": [operator_target]}]})
    return yaml.safe_dump({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                           "scrape_configs": jobs}, sort_keys=False)


def targets_document(targets: Sequence[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    """file_sd JSON: one group per target, with its labels."""
    return [{"targets": [addr], "labels": dict(labels)} for addr, labels in targets]


def write_targets(path: Path, targets: Sequence[tuple[str, dict[str, str]]]) -> None:
    """Atomically replace the file_sd targets file (Prometheus never reads a half-written file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets_document(targets), indent=1), encoding="utf-8")
    os.replace(tmp, path)


def panel_queries(dashboard: Mapping[str, Any], range_s: float, rate_interval: str = "10s") -> list[tuple[str, list[str]]]:
    """(panel title, PromQL expressions) of every panel, with the dashboard's variables set as Grafana
    sets them for "All" (``$namespace``, ``$job`` -> ``.*``), ``$__rate_interval`` and ``$__range``."""
    subs = {"$namespace": ".*", "$job": ".*", "$__rate_interval": rate_interval,
            "$__range": f"{max(1, int(range_s))}s", "$__interval": "2s"}
    out = []
    for panel in dashboard.get("panels") or []:
        exprs = []
        for target in panel.get("targets") or []:
            expr = str(target.get("expr") or "")
            for k, v in subs.items():
                expr = expr.replace(k, v)
            if expr:
                exprs.append(expr)
        if exprs:
            out.append((str(panel.get("title")), exprs))
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalPrometheus:
    """A Prometheus process on 127.0.0.1 with its data under ``work_dir`` (see the module docstring)."""

    def __init__(self, work_dir: Path, binary: str, operator_target: str | None = None) -> None:
        self.work_dir = work_dir
        self.binary = binary
        self.operator_target = operator_target
        self.targets_file = work_dir / "targets.json"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the web UI / HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        """Write the config, start Prometheus and wait until it is ready (RuntimeError otherwise)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_targets(self.targets_file, [])
        config = self.work_dir / "prometheus.yml"
        config.write_text(scrape_config(self.targets_file, self.operator_target), encoding="utf-8")
        self.port = free_port()
        log = open(self.work_dir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.work_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.work_dir / 'prometheus.log'}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            time.sleep(0.2)
        raise RuntimeError(f"prometheus was not ready after {timeout_s:.0f}s")

    def set_targets(self, targets: Sequence[tuple[str, dict[str, str]]]) -> None:
        """Replace the scraped pod endpoints."""
        write_targets(self.targets_file, targets)

    def query(self, promql: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Instant query; the result vector (RuntimeError on an API error)."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode())
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, promql: str, start: float, end: float, step_s: float = 2.0,
                    timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Range query (as a Grafana time-series panel runs it); the result matrix."""
        params = urllib.parse.urlencode({"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step_s})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{params}", timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode())
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def stop(self) -> None:
        """Terminate Prometheus."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

"""Operator scale benchmark: N TrainJobs x P pods applied at once against kmock's Kubernetes emulator.

The emulator (kmock's, with O(1) request bookkeeping: see tests/helpers/operator_env.IndexedEmulator)
serves on loopback from this process; the operator runs as `trex operator run` in a
subprocess (its real CLI, kubeconfig pointing at the emulator). Reports p50/p99 latency from apply to
all children created (ConfigMap, Service, P pods), total time, the operator's peak RSS, API requests
per job, reconcile errors (from the operator's own /metrics) and duplicate children.

    .venv/bin/python benchmarks/operator_scale.py --jobs 500 --pods 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "helpers"))

from operator_env import EmulatorThread  # noqa: E402
from trex_operator.kube import Connection, Kube  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(url: str, path: Path) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters: [{{name: emu, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: emu, user: {token: bench}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: emu, namespace: default}}]\n")


def _children(emulator: Any) -> dict[str, set[str]]:
    """Job name -> names of its children (pods, config maps, services) currently stored."""
    out: dict[str, set[str]] = {}
    for (res, _ns, name), obj in list(emulator.objects.items()):
        if res.plural not in ("pods", "configmaps", "services") or obj.deleted:
            continue
        labels = obj.last.get("metadata", {}).get("labels", {}) or {}
        job = labels.get("trex.dev/job-name")
        if job:
            out.setdefault(job, set()).add(f"{res.plural}/{name}")
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def run(jobs: int, pods: int, timeout_s: float) -> dict[str, Any]:
    server = EmulatorThread(indexed=True)
    server.start()
    emulator = server.emulator
    tmp = Path(tempfile.mkdtemp(prefix="trex-bench-"))
    _kubeconfig(server.url, tmp / "kubeconfig")
    metrics_port = _free_port()
    env = {**os.environ, "TREX_OPERATOR_INTERVAL": "5", "PYTHONUNBUFFERED": "1"}
    log = open(tmp / "operator.log", "w")
    # TREX_BENCH_PROFILE=<file>: write a cProfile of the operator process there
    profile = ["-m", "cProfile", "-o", os.environ["TREX_BENCH_PROFILE"]] if os.environ.get("TREX_BENCH_PROFILE") else []
    proc = subprocess.Popen(
        [sys.executable, *profile, "-m", "trex", "operator", "run", "--kubeconfig", str(tmp / "kubeconfig"),
         "--metrics-port", str(metrics_port), "--liveness", ""], env=env, stdout=log, stderr=subprocess.STDOUT)
    import psutil

    ps = psutil.Process(proc.pid)
    peak_rss = 0
    kube = Kube(Connection(server=server.url), user_agent="bench-client")
    try:
        for _ in range(200):  # wait for the operator's metrics endpoint (it is up once kopf starts)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).read()
                break
            except OSError:
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        before = dict(emulator.stats)
        applied: dict[str, float] = {}
        sem = asyncio.Semaphore(64)

        async def apply(i: int) -> None:
            name = f"bench-{i:04d}"
            body = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob",
                    "metadata": {"name": name, "namespace": "default", "uid": f"uid-{i}", "resourceVersion": "1",
                                 "generation": 1},
                    "spec": {"replicas": pods, "trainer": {"maxSteps": 10}}}
            async with sem:
                await kube.create(body)
            applied[name] = time.perf_counter()

        t0 = time.perf_counter()
        apply_task = asyncio.gather(*(apply(i) for i in range(jobs)))
        need = pods + 2
        while time.perf_counter() - t0 < timeout_s:
            await asyncio.sleep(0.2)
            peak_rss = max(peak_rss, ps.memory_info().rss)
            if sum(1 for v in list(emulator.created.values()) if len(v) >= need) >= jobs:
                break
        # when each job's last child was created (the emulator records it as it serves the create)
        done = {j: sorted(v)[need - 1] for j, v in list(emulator.created.items()) if len(v) >= need and j in applied}
        await apply_task
        total = (max(done.values()) if done else time.perf_counter()) - t0
        await asyncio.sleep(3.0)  # let in-flight reconciles settle before counting duplicates and requests
        peak_rss = max(peak_rss, ps.memory_info().rss)
        children = _children(emulator)
        delta = {k: v - before.get(k, 0) for k, v in dict(emulator.stats).items()}
        if os.environ.get("TREX_BENCH_DEBUG"):  # requests by (client, method, resource)
            print(sorted(((k, v) for k, v in delta.items() if v), key=lambda kv: -kv[1]))
        op_requests = sum(v for (agent, _m, _p), v in delta.items() if agent in ("trex-operator", "kopf"))
        pod_posts = delta.get(("trex-operator", "POST", "pods"), 0)
        extra = sum(max(0, len(v) - need) for v in children.values())
        cpu = ps.cpu_times()
        operator_cpu = cpu.user + cpu.system
        import resource

        self_usage = resource.getrusage(resource.RUSAGE_SELF)
        emulator_cpu = self_usage.ru_utime + self_usage.ru_stime
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        latencies = [done[j] - applied[j] for j in done]
        return {
            "jobs": jobs, "pods_per_job": pods, "completed": len(done),
            "p50_s": statistics.median(latencies) if latencies else float("nan"),
            "p99_s": _percentile(latencies, 0.99) if latencies else float("nan"),
            "total_s": total, "peak_rss_mib": peak_rss / 2**20,
            "api_requests_per_job": op_requests / jobs,
            "pod_creates": pod_posts, "extra_children": extra,
            "reconcile_errors": _metric(metrics, "trex_operator_reconciles_total", result="error"),
            "reconciles": _metric(metrics, "trex_operator_reconciles_total"),
            "operator_cpu_s": operator_cpu, "emulator_cpu_s": emulator_cpu,
            "reconcile_seconds_mean": _metric(metrics, "trex_operator_reconcile_seconds_sum")
            / max(1.0, _metric(metrics, "trex_operator_reconcile_seconds_count")),
        }
    finally:
        await kube.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        server.stop()
        if not os.environ.get("TREX_BENCH_DEBUG"):
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--pods", type=int, default=8)
    p.add_argument("--timeout", type=float, default=300.0, help="Give up after this many seconds.")
    args = p.parse_args()
    r = asyncio.run(run(args.jobs, args.pods, args.timeout))
    goals = {"p99 < 2 s": r["p99_s"] < 2.0, "zero errors": r["reconcile_errors"] == 0,
             "zero duplicate children": r["extra_children"] == 0,
             "RSS < 400 MiB": r["peak_rss_mib"] < 400}
    print(f"{r['jobs']} TrainJobs x {r['pods_per_job']} pods: {r['completed']} fully created")
    print(f"apply -> all children created: p50 {r['p50_s']:.2f} s, p99 {r['p99_s']:.2f} s; total {r['total_s']:.1f} s")
    print(f"operator peak RSS {r['peak_rss_mib']:.0f} MiB; API requests per job {r['api_requests_per_job']:.1f} "
          f"(reconciles {r['reconciles']:.0f}, errors {r['reconcile_errors']:.0f}); pod creates {r['pod_creates']}, "
          f"extra children {r['extra_children']}")
    print(f"CPU: operator {r['operator_cpu_s']:.1f} s, emulator + load generator {r['emulator_cpu_s']:.1f} s; "
          f"mean reconcile {1000 * r['reconcile_seconds_mean']:.0f} ms")
    for goal, ok in goals.items():
        print(f"  {goal}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

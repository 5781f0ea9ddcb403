"""Operator scale benchmark: N TrainJobs x P pods applied at once against kmock's Kubernetes emulator.

Three processes, like a real cluster: kmock's emulator (with O(1) request bookkeeping, see
trex_operator.local.apiserver.ApiServer, indexed) serves on loopback from its own process; the operator runs
as `trex operator run` (its real CLI, kubeconfig pointing at the emulator); this process applies the jobs
and watches the emulator's records. All three share the machine's cores.

First it measures the emulator's own capacity (pod creates per second from a trivial client, no operator,
on a fresh emulator), which bounds the whole run: the operator cannot create faster than the server accepts.
Then it reports p50/p99 latency from apply to the first child created (queueing) and to all children
created (ConfigMap, Service, P pods), total time, the operator's peak RSS and CPU per job, API requests
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
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

from trex_operator.kube import Connection, Kube


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


def _serve_emulator(pipe: Pipe) -> None:
    """The emulator process: serve on loopback and answer the benchmark's queries over ``pipe``."""
    from trex_operator.local.emulator import EmulatorThread

    server = EmulatorThread(indexed=True)
    server.start()
    emulator = server.emulator
    pipe.send(server.url)
    try:
        while True:
            cmd, arg = pipe.recv()
            if cmd == "complete":  # how many jobs have at least `arg` children created
                pipe.send(sum(1 for v in list(emulator.created.values()) if len(v) >= arg))
            elif cmd == "stats":
                pipe.send(dict(emulator.stats))
            elif cmd == "records":  # creation times (perf_counter, same clock as this machine's), children
                pipe.send(({k: list(v) for k, v in list(emulator.created.items())}, _children(emulator)))
            elif cmd == "cpu":
                cpu = os.times()
                pipe.send(cpu.user + cpu.system)
            else:
                break
    finally:
        server.stop()


class EmulatorProcess:
    """kmock's emulator in its own process (a real API server is not on the operator's or the client's cores)."""

    def __init__(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_emulator, args=(child,), name="kmock", daemon=True)
        self._proc.start()
        if not self._pipe.poll(60):
            raise RuntimeError("the Kubernetes emulator did not start")
        self.url: str = self._pipe.recv()

    def ask(self, cmd: str, arg: Any = None) -> Any:
        """One query to the emulator process."""
        self._pipe.send((cmd, arg))
        return self._pipe.recv()

    def stop(self) -> None:
        """Stop serving and wait for the process."""
        try:
            self._pipe.send(("stop", None))
        except OSError:
            pass
        self._proc.join(20)
        if self._proc.is_alive():
            self._proc.kill()


async def emulator_capacity(creates: int, concurrency: int = 64) -> float:
    """Pod creates per second a fresh emulator process accepts from a trivial client (no operator, no watches)."""
    server = EmulatorProcess()
    kube = Kube(Connection(server=server.url), user_agent="capacity-client")
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"capacity-{i}", "namespace": "default", "labels": {"app": "capacity"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        async with sem:
            await kube.create(body)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(creates)))
        return creates / (time.perf_counter() - t0)
    finally:
        await kube.close()
        server.stop()


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
    server = EmulatorProcess()
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
        before = server.ask("stats")
        cpu0 = ps.cpu_times()
        emu_cpu0 = server.ask("cpu")
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
            if server.ask("complete", need) >= jobs:
                break
        await apply_task
        created, _ = server.ask("records")
        # when each job's first and last child was created (the emulator records it as it serves the create)
        done = {j: sorted(v)[need - 1] for j, v in created.items() if len(v) >= need and j in applied}
        first = {j: min(v) for j, v in created.items() if v and j in applied}
        total = (max(done.values()) if done else time.perf_counter()) - t0
        busy_cpu = ps.cpu_times()
        await asyncio.sleep(3.0)  # let in-flight reconciles settle before counting duplicates and requests
        peak_rss = max(peak_rss, ps.memory_info().rss)
        _, children = server.ask("records")
        delta = {k: v - before.get(k, 0) for k, v in server.ask("stats").items()}
        if os.environ.get("TREX_BENCH_DEBUG"):  # requests by (client, method, resource)
            print(sorted(((k, v) for k, v in delta.items() if v), key=lambda kv: -kv[1]))
        op_requests = sum(v for (agent, _m, _p), v in delta.items() if agent in ("trex-operator", "kopf"))
        pod_posts = delta.get(("trex-operator", "POST", "pods"), 0)
        extra = sum(max(0, len(v) - need) for v in children.values())
        operator_cpu = (busy_cpu.user + busy_cpu.system) - (cpu0.user + cpu0.system)
        emulator_cpu = server.ask("cpu") - emu_cpu0
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        latencies = [done[j] - applied[j] for j in done]
        queueing = [first[j] - applied[j] for j in first]
        return {
            "jobs": jobs, "pods_per_job": pods, "completed": len(done),
            "p50_s": statistics.median(latencies) if latencies else float("nan"),
            "p99_s": _percentile(latencies, 0.99) if latencies else float("nan"),
            "first_p50_s": statistics.median(queueing) if queueing else float("nan"),
            "first_p99_s": _percentile(queueing, 0.99) if queueing else float("nan"),
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
    p.add_argument("--capacity-creates", type=int, default=3000,
                   help="Pod creates of the emulator capacity measurement (0: skip it).")
    args = p.parse_args()
    objects = args.jobs * (args.pods + 2)
    if args.capacity_creates > 0:
        rate = asyncio.run(emulator_capacity(args.capacity_creates))
        print(f"emulator capacity (own process, trivial client, no operator): {rate:.0f} creates/s; "
              f"the {objects} children + {args.jobs} jobs need >= {(objects + args.jobs) / rate:.1f} s at that rate")
    r = asyncio.run(run(args.jobs, args.pods, args.timeout))
    goals = {"p99 < 2 s": r["p99_s"] < 2.0, "zero errors": r["reconcile_errors"] == 0,
             "zero duplicate children": r["extra_children"] == 0,
             "RSS < 400 MiB": r["peak_rss_mib"] < 400}
    print(f"{r['jobs']} TrainJobs x {r['pods_per_job']} pods: {r['completed']} fully created "
          f"(emulator, operator and this client in 3 processes on {os.cpu_count()} cores)")
    print(f"apply -> first child created (queueing): p50 {r['first_p50_s']:.2f} s, p99 {r['first_p99_s']:.2f} s")
    print(f"apply -> all children created: p50 {r['p50_s']:.2f} s, p99 {r['p99_s']:.2f} s; total {r['total_s']:.1f} s "
          f"({objects / max(r['total_s'], 1e-9):.0f} children/s)")
    print(f"operator peak RSS {r['peak_rss_mib']:.0f} MiB; API requests per job {r['api_requests_per_job']:.1f} "
          f"(reconciles {r['reconciles']:.0f}, errors {r['reconcile_errors']:.0f}); pod creates {r['pod_creates']}, "
          f"extra children {r['extra_children']}")
    print(f"CPU while creating: operator {r['operator_cpu_s']:.1f} s ({1000 * r['operator_cpu_s'] / r['jobs']:.1f} ms/job), "
          f"emulator {r['emulator_cpu_s']:.1f} s (incl. the settle period); "
          f"mean reconcile {1000 * r['reconcile_seconds_mean']:.0f} ms")
    for goal, ok in goals.items():
        print(f"  {goal}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

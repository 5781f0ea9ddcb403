"""Sandbox start-up overhead per isolation mode against a bare ``python -c`` of the same interpreter, and
ORData accepted samples/s/core with the recorded-solve and structural gates.

Runs are interleaved (bare, then every mode, round after round) so drift hits all sides alike; the
figures are medians. Goal: ``kernel-fs`` on its warm path (a fork server inside one bwrap sandbox)
costs at most 1.5x the bare subprocess, for a trivial program and for one importing gurobipy; the
cold path (bwrap and a fresh interpreter per run) is shown for comparison, and so is ``namespaces`` (the
fallback where bwrap cannot run: the same minimal root, mounted and pivoted into by the bootstrap) through
its fork server and from a fresh interpreter per run. The ORData goal is >= 10 accepted samples/s/core
(single process, so the rate is per core).

    .venv/bin/python benchmarks/sandbox_overhead.py [--repeats N] [--ordata-per-family N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trex.sandbox import run_python
from trex.sandbox.runner import (
    MODE_VAR,
    WARM_VAR,
    ZYGOTE_VAR,
    kernel_fs_available,
    namespaces_available,
    pids_cgroup_base,
)

TRIVIAL = "print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 1.0}')"
GUROBI = "import gurobipy\n" + TRIVIAL
GOAL = 1.5
# (label, TREX_SANDBOX_MODE, TREX_SANDBOX_ZYGOTE, TREX_SANDBOX_WARM)
SETUPS = [("kernel-fs, warm fork server in bwrap", "kernel-fs", "auto", "auto"),
          ("kernel-fs, cold: bwrap per run", "kernel-fs", "auto", "off"),
          ("namespaces, fork server, own root", "namespaces", "auto", "auto"),
          ("namespaces, fresh interpreter, own root", "namespaces", "off", "auto"), ("audit", "audit", "off", "auto")]


def _bare(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", code], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def _sandboxed(code: str, mode: str, zygote: str, warm: str) -> float:
    os.environ[MODE_VAR], os.environ[ZYGOTE_VAR], os.environ[WARM_VAR] = mode, zygote, warm
    t = time.perf_counter()
    res = run_python(code)
    elapsed = time.perf_counter() - t
    if not res.ok or res.mode != mode or res.result is None or res.result["objective"] != 1.0:
        raise SystemExit(f"sandbox run failed ({mode}): {res}")
    return elapsed


def measure(code: str, setups: list[tuple[str, str, str, str]], repeats: int) -> tuple[float, list[float]]:
    """Median seconds of the bare run and of each setup over interleaved repeats (after one warm-up each)."""
    _bare(code)
    for _, mode, zygote, warm in setups:
        _sandboxed(code, mode, zygote, warm)
    bare: list[float] = []
    boxed: list[list[float]] = [[] for _ in setups]
    for _ in range(repeats):
        bare.append(_bare(code))
        for i, (_, mode, zygote, warm) in enumerate(setups):
            boxed[i].append(_sandboxed(code, mode, zygote, warm))
    return statistics.median(bare), [statistics.median(b) for b in boxed]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="interleaved runs per side (default 15)")
    ap.add_argument("--ordata-per-family", type=int, default=4, help="ORData instances per family (0: skip)")
    args = ap.parse_args(argv)
    available = {"kernel-fs": kernel_fs_available(sys.executable), "namespaces": namespaces_available(), "audit": True}
    setups = [s for s in SETUPS if available[s[1]]]
    print(f"modes available: {', '.join(m for m, ok in available.items() if ok)}; "
          f"pids_cgroup={'yes' if pids_cgroup_base() else 'no'} python={sys.version.split()[0]} "
          f"cores={os.cpu_count()} repeats={args.repeats}")
    goal_met = True
    for name, code in (("trivial", TRIVIAL), ("import gurobipy", GUROBI)):
        bare, medians = measure(code, setups, args.repeats)
        print(f"{name}: bare python -c {bare * 1e3:.1f} ms")
        for (label, mode, _, warm), med in zip(setups, medians, strict=True):
            goal = mode == "kernel-fs" and warm == "auto"
            verdict = f" (goal <= {GOAL:.1f}x: {'met' if med / bare <= GOAL else 'NOT met'})" if goal else ""
            print(f"  {label:<40} {med * 1e3:7.1f} ms  ratio {med / bare:4.2f}x  overhead "
                  f"{(med - bare) * 1e3:6.1f} ms{verdict}")
            goal_met = goal_met and (not goal or med / bare <= GOAL)
    for var in (MODE_VAR, ZYGOTE_VAR, WARM_VAR):
        os.environ.pop(var, None)
    if args.ordata_per_family > 0:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ordata_throughput import GOAL_PER_CORE, accepted_rate

        rates = {}
        for mode in [m for m in ("kernel-fs", "namespaces") if available[m]]:
            os.environ[MODE_VAR] = mode
            rates[mode] = accepted_rate(args.ordata_per_family)
        os.environ.pop(MODE_VAR, None)
        for mode, rate in rates.items():
            print(f"ORData with the recorded-solve and structural gates, {mode}: {rate:.2f} accepted samples/s/core "
                  f"(goal >= {GOAL_PER_CORE:g}: {'met' if rate >= GOAL_PER_CORE else 'NOT met'})")
    return 0 if goal_met else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Sandbox start-up overhead: ``trex.sandbox.run_python`` vs a bare ``python -c`` of the same interpreter.

Runs are interleaved (bare, sandbox, bare, sandbox, ...) so drift hits both sides alike; the
figures are medians. Goal: a trivial program costs at most 1.5x the bare subprocess. A second
pair does the same for a program that imports gurobipy (the usual payload).

    .venv/bin/python benchmarks/sandbox_overhead.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from trex.sandbox import run_python
from trex.sandbox.runner import ZYGOTE_VAR, isolation_mode, pids_cgroup_base

TRIVIAL = "print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 1.0}')"
GUROBI = "import gurobipy\n" + TRIVIAL


def _bare(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", code], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def _sandboxed(code: str) -> float:
    t = time.perf_counter()
    res = run_python(code)
    elapsed = time.perf_counter() - t
    if not res.ok or res.objective != 1.0:
        raise SystemExit(f"sandbox run failed: {res}")
    return elapsed


def measure(code: str, repeats: int) -> tuple[float, float]:
    """Median seconds of (bare, sandboxed) over interleaved repeats (after one warm-up each)."""
    _bare(code)
    _sandboxed(code)
    bare, sbx = [], []
    for _ in range(repeats):
        bare.append(_bare(code))
        sbx.append(_sandboxed(code))
    return statistics.median(bare), statistics.median(sbx)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="interleaved runs per side (default 20)")
    args = ap.parse_args(argv)
    print(f"isolation={isolation_mode()} pids_cgroup={'yes' if pids_cgroup_base() else 'no'} "
          f"python={sys.version.split()[0]} repeats={args.repeats}")
    goal_met = True
    rows = (("trivial", TRIVIAL, 1.5, "auto"), ("import gurobipy", GUROBI, None, "auto"),
            ("trivial, fresh interpreter per run (no fork server)", TRIVIAL, None, "off"))
    for name, code, goal, zygote in rows:
        os.environ[ZYGOTE_VAR] = zygote
        bare, sbx = measure(code, args.repeats)
        ratio = sbx / bare
        verdict = "" if goal is None else f" (goal <= {goal:.1f}x: {'met' if ratio <= goal else 'NOT met'})"
        if goal is not None and ratio > goal:
            goal_met = False
        print(f"{name}:\n  bare python -c {bare * 1e3:7.1f} ms   sandbox {sbx * 1e3:7.1f} ms   "
              f"ratio {ratio:4.2f}x   overhead {(sbx - bare) * 1e3:6.1f} ms{verdict}")
    return 0 if goal_met else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""ORData throughput: accepted samples per second per core on the default mix and per family, where the time
goes (solver, sandbox, the rest), and the sandbox's overhead against a bare ``python -c`` subprocess.

Run: ``.venv/bin/python benchmarks/ordata_throughput.py [--per-family N] [--repeats R]``. Single process, so the
rates are per core. Prints a table and the goal check (>= 10 accepted samples/s/core on the default mix).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

GOAL_PER_CORE = 10.0


def _mix(per_family: int) -> None:
    from trex.ordata.config import ORDataConfig
    from trex.ordata.pipeline import StageTimer, plan_instance, process

    cfg = ORDataConfig(count=16 * per_family, seed=2024)
    timer = StageTimer()
    per_fam_s: dict[str, float] = defaultdict(float)
    per_fam_ok: dict[str, int] = defaultdict(int)
    outcomes: dict[str, int] = defaultdict(int)
    t0 = time.perf_counter()
    for i in range(cfg.count):
        plan = plan_instance(cfg, i)
        t = time.perf_counter()
        out = process(plan, cfg, timer)
        per_fam_s[plan.family] += time.perf_counter() - t
        per_fam_ok[plan.family] += out.outcome == "accepted"
        outcomes[out.outcome] += 1
    wall = time.perf_counter() - t0
    accepted = outcomes.get("accepted", 0)
    rate = accepted / wall
    print(f"default mix: {cfg.count} instances, {accepted} accepted in {wall:.2f} s -> "
          f"{rate:.2f} accepted samples/s/core (goal >= {GOAL_PER_CORE:g}: {'met' if rate >= GOAL_PER_CORE else 'NOT met'})")
    print(f"outcomes: {dict(sorted(outcomes.items()))}")
    stages = dict(timer.seconds)
    solver = stages.get("solve", 0.0)
    sandbox = stages.get("sandbox", 0.0)
    rest = wall - solver - sandbox
    print(f"time share: solver {100 * solver / wall:.1f}%  sandbox {100 * sandbox / wall:.1f}%  "
          f"rest {100 * rest / wall:.1f}%  (stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(stages.items())) + ")")
    print(f"{'family':<20}{'accepted':>9}{'seconds':>9}{'acc/s':>8}")
    for fam in sorted(per_fam_s):
        print(f"{fam:<20}{per_fam_ok[fam]:>9}{per_fam_s[fam]:>9.2f}{per_fam_ok[fam] / per_fam_s[fam]:>8.2f}")


def _sandbox_overhead(repeats: int) -> None:
    from trex.sandbox import run_python

    programs = {"trivial": "print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 1, \"values\": {}}')",
                "import gurobipy": "import gurobipy\nprint('ok')"}
    for name, code in programs.items():
        bare: list[float] = []
        boxed: list[float] = []
        for _ in range(repeats):  # interleaved so drift hits both equally
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            res = run_python(code)
            boxed.append(time.perf_counter() - t)
            assert res.ok, res.stderr
        mb, ms = statistics.median(bare), statistics.median(boxed)
        print(f"sandbox overhead ({name}): bare python -c {1000 * mb:.1f} ms, sandbox {1000 * ms:.1f} ms, "
              f"ratio {ms / mb:.2f}x (median of {repeats})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--per-family", type=int, default=6, help="instances per family in the default mix")
    ap.add_argument("--repeats", type=int, default=15, help="sandbox overhead repetitions")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory():
        _mix(args.per_family)
    _sandbox_overhead(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

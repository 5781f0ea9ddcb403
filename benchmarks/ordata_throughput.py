"""ORData throughput: accepted samples per second per core on the default mix and per family, and where the
time goes (solver, sandbox, the rest). The sandbox's own start-up overhead is measured by
``benchmarks/sandbox_overhead.py``.

Run: ``.venv/bin/python benchmarks/ordata_throughput.py [--per-family N]``. Single process, so the rates are per
core. Prints a table and the goal check (>= 10 accepted samples/s/core on the default mix).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict

GOAL_PER_CORE = 10.0


def accepted_rate(per_family: int) -> float:
    """Run the default mix, print the breakdown, return accepted samples/s (one process: per core)."""
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
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--per-family", type=int, default=6, help="instances per family in the default mix")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory():
        accepted_rate(args.per_family)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stage 1 on real cpu-c kernels: does the tiling MILP's latency model rank configurations the way they run,
and does seeding the search with its optimum reach the best configuration in fewer trials than random starts?

Per kernel (default shape, fp32, one thread: the 2 cores are shared, a second thread mostly measures the
scheduler):
1. Candidates: the MILP's top-k plus as many random feasible configurations. Each of ``--processes``
   separate worker processes compiles, gates and times every candidate (its own shuffled order, 2 x
   ``--samples`` interleaved samples each); a candidate's latency is the median of its samples pooled over
   the processes. Spearman(predicted, pooled median) over them, for the MILP's model and, side by side, the
   backend's analytic predictor. Noise: per candidate, the spread of its per-process medians relative to
   their median (column noise: the median of those). A kernel is reported flat when a randomized-block
   permutation test (processes as blocks) does not find its candidates' per-process medians to differ
   (p > 0.05): their order is noise and the correlation is undefined there.
2. Trials-to-best: the tree search with the same trial budget from the MILP's optimum and from R random
   feasible starts, all in this process; the target is the fastest node any of these searches measured,
   within ``--tolerance``; trials-to-best is the trial after which a search's best node first came within
   it (budget + 1 when never; 0 = its start already was). The MILP start is compared with the median over
   the R random starts.
Goals: Spearman >= 0.6 per kernel on the suite; fewer trials from the MILP on most kernels.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def trials_to_best(state: dict[str, Any], best_s: float, tolerance: float) -> int | None:
    """Trials after which the search's tree first held a node within ``tolerance`` of ``best_s`` seconds."""
    for n in sorted(state["nodes"], key=lambda n: -1 if n["trial"] is None else n["trial"]):
        if 0 < n["median_s"] <= best_s * (1 + tolerance):
            return 0 if n["trial"] is None else int(n["trial"]) + 1
    return None


def pooled(per_process: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(median of all samples pooled over the processes, spread of the per-process medians relative to their
    median: (max - min) / median; 0 with one process)."""
    meds = [statistics.median(s) for s in per_process]
    allv = [v for s in per_process for v in s]
    mid = statistics.median(meds)
    return statistics.median(allv), (max(meds) - min(meds)) / mid if mid > 0 else 0.0


def differ_p(per_process_medians: Sequence[Sequence[float]], permutations: int = 4000, seed: int = 0) -> float | None:
    """p-value that the candidates' latencies differ, from a randomized-block permutation test: rows are
    candidates, columns processes (blocks, so a process that ran slower overall is not read as a difference);
    the statistic is the between-candidate over the residual mean square of log medians, the null shuffles
    candidates within each process. None with fewer than 2 processes or 3 candidates."""
    import numpy as np

    m = np.log(np.asarray(per_process_medians, dtype=float))
    n, k = m.shape
    if k < 2 or n < 3:
        return None

    def stat(a: Any) -> float:
        rows = a.mean(axis=1, keepdims=True)
        resid = a - rows - a.mean(axis=0, keepdims=True) + a.mean()
        ss_rows = k * float(((rows - a.mean()) ** 2).sum())
        return float(ss_rows) / max(float((resid ** 2).sum()), 1e-300)

    obs = stat(m)
    rng = np.random.default_rng(seed)
    hits = sum(stat(np.stack([rng.permutation(m[:, j]) for j in range(k)], axis=1)) >= obs for _ in range(permutations))
    return (hits + 1) / (permutations + 1)


def ttb_or_over(v: int | None, budget: int) -> int:
    """Trials-to-best with "never within the budget" counted as budget + 1 (so medians are defined)."""
    return budget + 1 if v is None else v


def measure_worker(job_path: Path, out_path: Path, proc: int, samples: int) -> None:
    """One process: gate and time every candidate of every kernel in ``job_path``; write the samples (None for
    a candidate that fails to compile or to pass the gate)."""
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.harness import KernelEvaluator
    from trex.kernels.profile import interleaved
    from trex.kernels.suite import SUITE

    job = json.loads(job_path.read_text())
    be = CpuCBackend()
    facts = be.facts()
    out: dict[str, list[list[float] | None]] = {}
    for name, cands in job.items():
        spec = SUITE[name]
        shape = dict(spec.default_shapes[0])
        ev = KernelEvaluator(spec, shape, "fp32", be, facts, samples=samples, seed=proc)
        res: list[list[float] | None] = [None] * len(cands)
        order = list(range(len(cands)))
        random.Random(1000 + proc).shuffle(order)
        for i in order:
            try:
                ev.compiled(cands[i])
            except Exception:
                continue
            if ev.gate(cands[i]):
                continue
            f = ev.launcher(cands[i])
            t = interleaved(f, f, samples=samples, sync=be.synchronize, seed=proc)
            res[i] = [*t.cand, *t.base]
        out[name] = res
        print(f"process {proc}: {name} measured", file=sys.stderr, flush=True)
    out_path.write_text(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", default="", help="comma-separated subset (default: the suite)")
    ap.add_argument("--k", type=int, default=6, help="MILP candidates (and as many random ones)")
    ap.add_argument("--trials", type=int, default=12, help="trial budget of every search")
    ap.add_argument("--random-starts", type=int, default=5)
    ap.add_argument("--processes", type=int, default=3, help="separate processes timing the candidates")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure", nargs=3, metavar=("JOB", "OUT", "PROC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        measure_worker(Path(args.measure[0]), Path(args.measure[1]), int(args.measure[2]), args.samples)
        return 0

    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.harness import KernelEvaluator
    from trex.kernels.search import Budget, SearchConfig, run_search
    from trex.kernels.suite import SUITE
    from trex.kernels.tiling import enumerate_configs, model_time, plan
    from trex.kernels.tune import spearman

    t0 = time.monotonic()
    be = CpuCBackend()
    facts = be.facts()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="trex-tiling-bench-"))
    names = [k for k in args.kernels.split(",") if k] or list(SUITE)
    setup: dict[str, dict[str, Any]] = {}
    for name in names:
        spec = SUITE[name]
        shape = dict(spec.default_shapes[0])
        space = {**be.param_space(spec, shape), "THREADS": (1,)}
        if "CHUNK" in space:
            space["CHUNK"] = (be.default_params(spec, shape)["CHUNK"],)
        fixed = {p: v[0] for p, v in space.items() if len(v) == 1}
        pl = plan(spec, shape, "fp32", be, facts, k=args.k, fixed=fixed)
        assert pl.model is not None
        feasible = [c for c in enumerate_configs(space) if model_time(pl.model, c) is not None]
        milp = [c.params for c in pl.ranked]
        others = [c for c in feasible if c not in milp]
        cands = milp + rng.sample(others, min(args.k, len(others)))
        starts = rng.sample(others, min(args.random_starts, len(others)))
        setup[name] = {"spec": spec, "shape": shape, "space": space, "plan": pl, "cands": cands, "starts": starts}

    # phase 1: candidates timed in separate processes, one after the other
    job = work / "candidates.json"
    job.write_text(json.dumps({n: s["cands"] for n, s in setup.items()}))
    per_proc: list[dict[str, list[list[float] | None]]] = []
    for p in range(args.processes):
        out = work / f"measured-{p}.json"
        subprocess.run([sys.executable, __file__, "--samples", str(args.samples), "--measure", str(job), str(out), str(p)],
                       check=True)
        per_proc.append(json.loads(out.read_text()))

    rows: list[dict[str, Any]] = []
    for name, s in setup.items():
        spec, shape, pl = s["spec"], s["shape"], s["plan"]
        ok = [i for i in range(len(s["cands"])) if all(pp[name][i] is not None for pp in per_proc)]
        stats = [pooled([pp[name][i] for pp in per_proc]) for i in ok]  # type: ignore[misc]
        meds, spreads = [m for m, _ in stats], [sp for _, sp in stats]
        pred = [model_time(pl.model, s["cands"][i])[0] for i in ok]  # type: ignore[index]
        analytic = [be.predict(spec, shape, "fp32", s["cands"][i], facts) for i in ok]
        p_differ = differ_p([[statistics.median(pp[name][i]) for pp in per_proc] for i in ok])  # type: ignore[arg-type]
        flat = p_differ is not None and p_differ > 0.05
        per_rho = [spearman(pred, [statistics.median(pp[name][i]) for i in ok]) for pp in per_proc]  # type: ignore[arg-type]

        # phase 2: searches from the MILP optimum and from random starts, in this process
        ev = KernelEvaluator(spec, shape, "fp32", be, facts, samples=args.samples, seed=args.seed)
        states = {}
        for label, root in [("milp", pl.ranked[0].params)] + [(f"random{i}", c) for i, c in enumerate(s["starts"])]:
            cfg = SearchConfig(space=s["space"], root=root, budget=Budget(args.trials, 900.0), plan_order=pl.param_order)
            states[label] = run_search(work / f"{name}-{label}.json", ev, cfg)
        best = min(n["median_s"] for st in states.values() for n in st["nodes"] if n["median_s"] > 0)
        ttb = {lb: trials_to_best(st, best, args.tolerance) for lb, st in states.items()}
        rand = [ttb_or_over(v, args.trials) for lb, v in ttb.items() if lb != "milp"]
        row = {"kernel": name, "n": len(ok), "spearman": None if flat else spearman(pred, meds),
               "spearman_analytic": None if flat else spearman(analytic, meds), "flat": flat, "p_differ": p_differ,
               "range": max(meds) / min(meds) - 1.0, "noise": statistics.median(spreads),
               "spearman_per_process": per_rho, "best_ms": best * 1e3, "ttb": ttb,
               "ttb_milp": ttb_or_over(ttb["milp"], args.trials), "ttb_random_median": statistics.median(rand),
               "milp_start_ms": states["milp"]["nodes"][0]["median_s"] * 1e3,
               "random_start_ms": statistics.median(st["nodes"][0]["median_s"] for lb, st in states.items()
                                                    if lb != "milp") * 1e3}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
    over = args.trials + 1
    print(f"{'kernel':18s} {'n':>3s} {'rho MILP':>8s} {'rho pred':>8s} {'range':>6s} {'noise':>6s} {'p':>6s} {'rho/process':>17s} "
          f"{'best ms':>8s} {'start ms MILP/rand':>19s} {'ttb MILP':>8s} {'ttb rand med':>12s}  ttb random starts")
    for r in rows:
        rho = "flat" if r["flat"] else fmt(r["spearman"])
        rho_a = "flat" if r["flat"] else fmt(r["spearman_analytic"])
        pr = "/".join(fmt(x) for x in r["spearman_per_process"])
        rs = ",".join(fmt(ttb_or_over(v, args.trials)) for lb, v in r["ttb"].items() if lb != "milp")
        print(f"{r['kernel']:18s} {r['n']:3d} {rho:>8s} {rho_a:>8s} {r['range']:6.1%} {r['noise']:6.1%} {'-' if r['p_differ'] is None else format(r['p_differ'], '.3f'):>6s} {pr:>17s} "
              f"{r['best_ms']:8.3f} {r['milp_start_ms']:9.3f}/{r['random_start_ms']:<9.3f} {r['ttb_milp']:8d} "
              f"{fmt(float(r['ttb_random_median'])):>12s}  {rs}")
    defined = [r for r in rows if r["spearman"] is not None]
    flat_names = [r["kernel"] for r in rows if r["flat"]]
    print(f"\nSpearman(MILP model, pooled medians over {args.processes} processes) >= 0.6 on "
          f"{sum(r['spearman'] >= 0.6 for r in defined)}/{len(defined)} kernels where it is defined "
          f"(median {statistics.median(r['spearman'] for r in defined) if defined else float('nan'):.2f}); "
          f"flat (candidates not distinguishable, p > 0.05; undefined): {', '.join(flat_names) or 'none'}")
    fewer = sum(r["ttb_milp"] < r["ttb_random_median"] for r in rows)
    ties = sum(r["ttb_milp"] == r["ttb_random_median"] for r in rows)
    print(f"trials-to-best ({over} = not within the budget of {args.trials}): MILP start fewer than the median of "
          f"{args.random_starts} random starts on {fewer}/{len(rows)} kernels, equal on {ties}, more on "
          f"{len(rows) - fewer - ties} (goal: fewer on most)")
    print(f"wall time {time.monotonic() - t0:.0f} s; shared 2-core host: timings are noisy")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stage 3 on real cpu-c kernels: does a skill library make a second, related search reach the first
search's speedup in fewer trials?

1. Search A (no skills) on kernel/shape A from the plain starting configuration (scalar loops, one
   thread); every verified gain is recorded as a skill.
2. On each related problem B (another shape of the same kernel, and another kernel of the same class),
   run the search without skills and with the skills retrieved for B, interleaved (the order alternates
   per repetition), for a few repetitions with different seeds (inputs and bootstrap), each stopping when
   it reaches A's speedup over its own plain start or when the trial budget is spent.
3. Print, per problem and arm, the trials each repetition needed to reach A's speedup and to reach B's
   own level (0.9 x the median best speedup over both arms, for when A's speedup is out of B's reach;
   None = not within the budget), the best speedup it reached, and the medians.

Everything is really compiled, gated for correctness and timed (interleaved ABBA against the parent,
medians, 95 % bootstrap CI), at one thread; the cost model orders moves in both arms exactly as in
`trex kernels tune` (or in neither, with --no-cost-model), so the only difference between the arms is the
retrieved skills.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def search(kernel: str, shape: dict[str, int], workdir: Path, name: str, trials: int, samples: int, seed: int,
           skills: Any = (), target: float | None = None, record: Any = None, model: bool = True) -> dict[str, Any]:
    """One real search from the plain one-thread start; returns the final search state. ``model`` False
    switches the cost model and the tiling plan's order off (moves in parameter-name order unless a skill
    ranks them), isolating what skills alone contribute."""
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.harness import KernelEvaluator
    from trex.kernels.search import Budget, SearchConfig, run_search
    from trex.kernels.suite import get
    from trex.kernels.tiling import plan

    be = CpuCBackend()
    facts = be.facts()
    spec = get(kernel)
    pl = plan(spec, shape, "fp32", be, facts, k=1)
    def flat(*_: Any) -> float:
        return 1.0

    ev = KernelEvaluator(spec, shape, "fp32", be, facts, samples=samples, seed=seed,
                         predictor=be.predict if model else flat)
    # one thread: on a shared 2-core host a second thread mostly measures the scheduler
    space = {**be.param_space(spec, shape), "THREADS": (1,), "CHUNK": (16,)}
    root = {**be.default_params(spec, shape), "THREADS": 1, "CHUNK": 16}
    cfg = SearchConfig(space=space, root=root, budget=Budget(trials, 900.0), plan_order=pl.param_order if model else (),
                       skills=skills, target_speedup=target)
    state: dict[str, Any] = run_search(workdir / f"{name}.json", ev, cfg, on_accept=record)
    return state


def main(argv: list[str] | None = None) -> int:
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.roofline import classify
    from trex.kernels.search import trials_to_reach
    from trex.kernels.skills import Context, Skill, SkillLibrary
    from trex.kernels.suite import get
    from trex.kernels.suite.base import shape_bucket

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=20, help="trial budget of every search")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (seeds) per problem B and arm")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--problem-a", default="cross_entropy:64x32000",
                    help="kernel:dims, the dims in the kernel's dim_names order joined by x")
    ap.add_argument("--related", default="cross_entropy:128x16000,kl_div:32x32000",
                    help="problems B, comma-separated, in the same form")
    ap.add_argument("--no-cost-model", action="store_true",
                    help="order moves without the cost model in every search (skills alone rank moves)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trex-kernels-skills-"))
    be = CpuCBackend()
    facts = be.facts()

    def problem(text: str) -> tuple[Any, dict[str, int], str]:
        kernel, dims = text.split(":")
        spec = get(kernel)
        return spec, dict(zip(spec.dim_names, map(int, dims.split("x")), strict=True)), dims

    lib = SkillLibrary(work / "skills.jsonl")
    spec_a, shape_a, dims_a = problem(args.problem_a)
    regime_a = classify(spec_a, shape_a, "fp32", facts).regime

    def rec(new: dict[str, Any], parent: dict[str, Any]) -> None:
        p, v = new["move"]
        lib.add([Skill(spec_a.name, spec_a.kclass, regime_a, shape_bucket(shape_a), facts.name, be.name,
                       new["direction"], p, int(parent["params"][p]), int(v), float(new["gain"]))])

    model = not args.no_cost_model
    first = search(spec_a.name, shape_a, work, "A", args.trials, args.samples, 0, record=rec, model=model)
    s_a = max(n["speedup"] for n in first["nodes"])
    print(f"search A: {spec_a.name} {dims_a}, no skills: x{s_a:.2f} over the plain start after "
          f"{len(first['trials'])} trials; {len(lib.load())} skills recorded "
          f"({', '.join(f'{s.param}={s.new} x{s.gain:.2f}' for s in lib.load())})", flush=True)
    for item in args.related.split(","):
        spec_b, shape_b, shp = problem(item)
        kernel = spec_b.name
        ctx = Context(spec_b.name, spec_b.kclass, classify(spec_b, shape_b, "fp32", facts).regime,
                      shape_bucket(shape_b), facts.name, be.name)
        matches = lib.retrieve(ctx)
        states: dict[str, list[dict[str, Any]]] = {"without skills": [], "with skills": []}
        for rep in range(args.reps):
            arms = [("without skills", ()), ("with skills", matches)]
            for arm, sk in (arms if rep % 2 == 0 else arms[::-1]):
                states[arm].append(search(kernel, shape_b, work, f"B-{kernel}-{shp}-{arm.replace(' ', '-')}-{rep}",
                                          args.trials, args.samples, 1 + rep, skills=sk, target=s_a, model=model))
        best = {arm: [max(n["speedup"] for n in st["nodes"]) for st in sts] for arm, sts in states.items()}
        # B's own reachable level: 0.9 x the median best over both arms (A's speedup may be out of B's reach)
        own = 0.9 * _median(best["without skills"] + best["with skills"])
        print(f"\nproblem B: {kernel} {shp} ({len(matches)} skills retrieved), budget {args.trials} trials, "
              f"{args.reps} seeds; targets: A's x{s_a:.2f}, and B's own level x{own:.2f}")
        for arm, sts in states.items():
            for label, goal in (("A's speedup", s_a), ("B's level", own)):
                need = [trials_to_reach(st, goal) for st in sts]
                # a run that never reached the goal counts as budget + 1 in the median (it needed more)
                med = _median([float(t if t is not None else args.trials + 1) for t in need])
                print(f"  {arm:15s} trials to reach {label} {need} (median {med:.1f}; None = not within "
                      f"{args.trials}, counted as {args.trials + 1})")
            print(f"  {arm:15s} best speedup reached: {[round(b, 2) for b in best[arm]]} "
                  f"(median x{_median(best[arm]):.2f})")
    print(f"\nwall time {time.monotonic() - t0:.0f} s; shared 2-core host, one thread; work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

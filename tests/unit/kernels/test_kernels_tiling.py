"""Stage 1: the MILP's choices respect capacity and divisibility and match brute-force enumeration;
the roofline regime agrees with closed-form arithmetic intensity."""

from __future__ import annotations

import itertools
import random

import pytest
from trex.kernels.backends.base import DeviceFacts
from trex.kernels.roofline import classify, predict
from trex.kernels.suite import SUITE
from trex.kernels.tiling import admissible, plan, solve_selection, working_set


def _brute(costs: list[float], weights: list[float], cap: float, allowed: list[bool], k: int) -> list[int]:
    feas = [i for i in range(len(costs)) if allowed[i] and weights[i] <= cap]
    return sorted(feas, key=lambda i: (costs[i], i))[:k]


@pytest.mark.parametrize("solver", ["highs", "gurobi"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selection_matches_brute_force(solver: str, seed: int) -> None:
    rng = random.Random(seed)
    n = 120
    costs = [rng.uniform(1, 100) for _ in range(n)]
    weights = [rng.uniform(0, 64) for _ in range(n)]
    allowed = [rng.random() > 0.3 for _ in range(n)]
    got = solve_selection(costs, weights, 20.0, allowed, k=5, solver=solver)  # type: ignore[arg-type]
    assert got == _brute(costs, weights, 20.0, allowed, 5)
    assert all(weights[i] <= 20.0 and allowed[i] for i in got)


def test_infeasible_selection_returns_nothing() -> None:
    assert solve_selection([1.0, 2.0], [10.0, 10.0], 5.0, [True, True], k=3) == []


@pytest.mark.parametrize("name", ["grouped_gemm", "cross_entropy", "rmsnorm_fwd", "mhc_pre"])
def test_plan_respects_capacity_and_divisibility(cpu_backend, name: str) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE[name]
    shape = spec.default_shapes[0]
    facts = cpu_backend.facts()
    cap = 256 << 10
    p = plan(spec, shape, "fp32", cpu_backend, facts, predict, k=4, capacity=cap)
    assert 1 <= len(p.ranked) <= 4
    for c in p.ranked:
        assert working_set(spec, shape, "fp32", c.params) <= cap
        assert admissible(spec, shape, c.params, 2) is None
    # the top choice is the best feasible configuration by brute force over the same space
    space = cpu_backend.param_space(spec, shape)
    best = None
    for combo in itertools.product(*[space[k] for k in sorted(space)]):
        cfg = dict(zip(sorted(space), combo, strict=True))
        if admissible(spec, shape, cfg, 2) is None and working_set(spec, shape, "fp32", cfg) <= cap:
            t = predict(spec, shape, "fp32", cfg, facts)
            best = t if best is None or t < best else best
    assert best is not None and abs(p.ranked[0].predicted - best) <= 1e-9 * best
    assert [c.predicted for c in p.ranked] == sorted(c.predicted for c in p.ranked)
    assert p.directions and set(p.directions) <= {"tile", "vectorise", "unroll", "multi-row", "loop-order",
                                                  "fusion", "accumulation", "threads"}


def test_gemm_tiles_obey_vector_width_divisibility(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE["grouped_gemm"]
    shape = spec.default_shapes[0]
    p = plan(spec, shape, "fp32", cpu_backend, cpu_backend.facts(), predict, k=10)
    for c in p.ranked:
        if c.params["VEC"]:
            assert c.params["NB"] % c.params["VEC"] == 0


def test_roofline_regimes_follow_arithmetic_intensity() -> None:
    facts = DeviceFacts(name="t", peak_flops=1e11, bandwidth=1e10, caches={"L2": 1 << 20}, level_bandwidth={}, cores=1)
    rms = SUITE["rmsnorm_fwd"]
    r = classify(rms, {"rows": 4096, "cols": 4096}, "fp32", facts)
    assert r.regime == "memory" and r.intensity == pytest.approx(4 * 4096 * 4096 / (8 * 4096 * 4096 + 4 * 4096 + 4 * 4096))
    gemm = SUITE["grouped_gemm"]
    g = classify(gemm, {"tokens": 4096, "experts": 1, "hidden": 4096, "out": 4096}, "fp32", facts)
    assert g.regime == "compute" and g.intensity > g.ridge == 10.0
    tiny = classify(rms, {"rows": 1, "cols": 64}, "fp32", facts)
    assert tiny.regime == "overhead"

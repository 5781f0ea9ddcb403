"""Generators: every family solves with both solvers (agreeing), verifies, is deterministic and has 3+ domains.

Brute force or scipy models built from the instance *parameters* (not from the IR) check that the IR encodes
the intended problem.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from trex.ordata.config import FAMILY_NAMES, ToleranceConfig
from trex.ordata.generators import FAMILIES, GenerationError, derive_seed, sample_feasible
from trex.ordata.generators.base import Family, Infeasible
from trex.ordata.ir import Instance
from trex.ordata.solve import fits_gurobi_licence, solve
from trex.ordata.verify import objective_agrees, verify_solution

TOL = ToleranceConfig()


def _gen(family: str, index: int = 0, size: int = 5, master: int = 11) -> Instance:
    return sample_feasible(FAMILIES[family], derive_seed(master, family, index), size)[0]


def test_all_sixteen_families_registered() -> None:
    assert sorted(FAMILIES) == sorted(FAMILY_NAMES)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_solves_verifies_and_solvers_agree(family: str) -> None:
    for size in (3, 6):
        inst = _gen(family, size=size)
        assert fits_gurobi_licence(inst)
        g = solve(inst, "gurobi")
        h = solve(inst, "highs")
        assert (g.solver, h.solver) == ("gurobi", "highs")
        assert g.optimal and h.optimal, (g.message, h.message)
        assert g.objective is not None and h.objective is not None
        assert objective_agrees(g.objective, h.objective, TOL.objective_rel)
        for res in (g, h):
            v = verify_solution(inst, res.values, res.objective, TOL)
            assert v.ok, v


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_is_deterministic_by_seed_and_has_three_domains(family: str) -> None:
    a, b = _gen(family, index=4), _gen(family, index=4)
    assert a.content_hash() == b.content_hash()
    assert _gen(family, index=5).content_hash() != a.content_hash()
    fam = FAMILIES[family]
    assert len({d.key for d in fam.domains}) >= 3
    # entity names differ per domain
    pools = [frozenset(n for names in d.names.values() for n in names) for d in fam.domains]
    assert len(set(pools)) == len(pools)
    assert len({d.intro for d in fam.domains}) == len(fam.domains)
    domains = {_gen(family, index=i).domain for i in range(12)}
    assert len(domains) >= 2


def test_verify_detects_violations() -> None:
    inst = _gen("knapsack")
    res = solve(inst, "highs")
    assert res.objective is not None
    bad = dict(res.values)
    for v in inst.variables:
        bad[v.name] = 1.0  # take everything: breaks the capacity
    assert verify_solution(inst, bad, inst.evaluate_objective(bad), TOL).reason == "constraint_violation"
    frac = dict(res.values)
    frac[inst.variables[0].name] = 0.5
    assert verify_solution(inst, frac, inst.evaluate_objective(frac), TOL).reason in (
        "integrality_violation", "constraint_violation")
    assert verify_solution(inst, res.values, res.objective + 1.0, TOL).reason == "objective_mismatch"
    neg = dict(res.values)
    neg[inst.variables[0].name] = -1.0
    assert verify_solution(inst, neg, inst.evaluate_objective(neg), TOL).reason == "bound_violation"


def test_sampling_cap_raises_a_clear_error() -> None:
    def never(rng: np.random.Generator, size: int, dom: object, seed: int) -> Instance:
        raise Infeasible("always infeasible")

    fam = Family("diet", "LP", FAMILIES["diet"].domains, never)
    with pytest.raises(GenerationError, match=r"diet: no feasible bounded instance after 5 attempts.*always"):
        sample_feasible(fam, 1, 3, max_attempts=5)
    with pytest.raises(GenerationError, match="rejected by the check"):
        sample_feasible(FAMILIES["diet"], 1, 3, accept=lambda inst: "rejected by the check", max_attempts=3)


# --- independent references built from the parameters --------------------------------------------------
def _p(inst: Instance, name: str) -> np.ndarray:
    return np.array(inst.params[name].value, dtype=float)


@pytest.mark.parametrize("index", range(3))
def test_knapsack_matches_brute_force(index: int) -> None:
    inst = _gen("knapsack", index=index, size=5)
    w, v, cap = _p(inst, "weight"), _p(inst, "value"), float(_p(inst, "capacity"))
    best = max(float(v @ np.array(m)) for m in itertools.product((0, 1), repeat=len(w)) if w @ np.array(m) <= cap)
    assert solve(inst).objective == pytest.approx(best, abs=1e-6)


def test_capital_budgeting_and_set_covering_match_brute_force() -> None:
    inst = _gen("capital_budgeting", size=5)
    npv, out, bud = _p(inst, "npv"), _p(inst, "outlay"), _p(inst, "budget")
    best = max(float(npv @ np.array(m)) for m in itertools.product((0, 1), repeat=len(npv))
               if np.all(out @ np.array(m) <= bud))
    assert solve(inst).objective == pytest.approx(best, abs=1e-6)
    inst = _gen("set_covering", size=5)
    cost, cov = _p(inst, "cost"), _p(inst, "covers")
    best = min(float(cost @ np.array(m)) for m in itertools.product((0, 1), repeat=len(cost))
               if np.all(cov @ np.array(m) >= 1))
    assert solve(inst).objective == pytest.approx(best, abs=1e-6)


def test_assignment_matches_hungarian_algorithm() -> None:
    from scipy.optimize import linear_sum_assignment

    inst = _gen("assignment", size=6)
    cost = _p(inst, "cost")
    r, c = linear_sum_assignment(cost)
    assert solve(inst).objective == pytest.approx(float(cost[r, c].sum()), abs=1e-6)


@pytest.mark.parametrize("family", ["tsp", "vrp"])
def test_routing_matches_enumeration(family: str) -> None:
    inst = _gen(family, size=5)
    d = _p(inst, "distance")
    n = len(d)
    if family == "tsp":
        best = min(sum(d[a, b] for a, b in zip((0, *p), (*p, 0), strict=True))
                   for p in itertools.permutations(range(1, n)))
    else:
        dem, cap, k = _p(inst, "demand"), float(_p(inst, "capacity")), int(_p(inst, "vehicles"))
        best = np.inf
        for perm in itertools.permutations(range(1, n)):
            for cut in range(0, n):  # split the giant tour into at most two routes
                routes = [r for r in (perm[:cut], perm[cut:]) if r]
                if len(routes) > k or any(sum(dem[i - 1] for i in r) > cap for r in routes):
                    continue
                best = min(best, sum(sum(d[a, b] for a, b in zip((0, *r), (*r, 0), strict=True)) for r in routes))
    assert solve(inst).objective == pytest.approx(best, abs=1e-6)


def test_lp_families_match_scipy_linprog_from_parameters() -> None:
    from scipy.optimize import linprog

    inst = _gen("transportation", size=4)
    s, dem, c = _p(inst, "supply"), _p(inst, "demand"), _p(inst, "cost")
    m, n = c.shape
    a_ub = np.vstack([np.kron(np.eye(m), np.ones(n)), -np.kron(np.ones(m), np.eye(n))])
    ref = linprog(c.ravel(), A_ub=a_ub, b_ub=np.concatenate([s, -dem]), bounds=(0, None), method="highs")
    assert solve(inst).objective == pytest.approx(ref.fun, rel=1e-9)
    inst = _gen("diet", size=5)
    cost, cont, cap, req = _p(inst, "cost"), _p(inst, "content"), _p(inst, "max_amount"), _p(inst, "requirement")
    ref = linprog(cost, A_ub=-cont, b_ub=-req, bounds=list(zip(np.zeros_like(cap), cap, strict=True)), method="highs")
    assert solve(inst).objective == pytest.approx(ref.fun, rel=1e-9)


def test_portfolio_matches_numpy_kkt_when_only_budget_binds() -> None:
    inst = _gen("portfolio", size=4)
    cov = _p(inst, "covariance")
    res = solve(inst)
    w = np.array([res.values[v.name] for v in inst.variables])
    assert res.objective == pytest.approx(float(w @ cov @ w), rel=1e-6)
    assert w.sum() == pytest.approx(1.0, abs=1e-6)
    assert float(_p(inst, "expected_return") @ w) >= float(_p(inst, "target")) - 1e-6


def test_auto_solver_respects_the_gurobi_licence_limit() -> None:
    from trex.ordata.solve import pick_solver

    small = _gen("knapsack", size=5)
    big = sample_feasible(FAMILIES["knapsack"], 1, 1001)[0]  # 2002 binary variables
    assert (pick_solver(small, "auto"), pick_solver(small, "highs"), pick_solver(small, "gurobi")) == (
        "gurobi", "highs", "gurobi")
    assert pick_solver(big, "auto") == "highs" and pick_solver(big, "gurobi") == "highs"
    res = solve(big, "auto")
    assert res.solver == "highs" and res.optimal
    assert verify_solution(big, res.values, res.objective, TOL).ok

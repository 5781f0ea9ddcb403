"""Independent verification of a solver's answer: recompute objective, constraint and integrality violations.

Nothing here trusts the solver: values are plugged back into the IR with exact summation (math.fsum).
A configurable, deterministic fraction of instances is also solved by the other solver, which must agree.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from trex.ordata.config import ToleranceConfig
from trex.ordata.ir import Instance
from trex.ordata.solve import SolveResult, other_solver, solve_gurobi, solve_highs


@dataclass(frozen=True)
class Verification:
    """What the recomputation found; ``ok`` is False with a ``reason`` when any tolerance is exceeded."""

    ok: bool
    reason: str
    objective: float
    max_constraint_violation: float
    max_bound_violation: float
    max_integrality_violation: float


def objective_agrees(a: float, b: float, rel: float) -> bool:
    """|a - b| / (|b| + 1) <= rel (the config's objective agreement measure)."""
    return abs(a - b) / (abs(b) + 1.0) <= rel


def verify_solution(inst: Instance, values: dict[str, float], claimed_objective: float | None,
                    tol: ToleranceConfig) -> Verification:
    """Check ``values`` against every constraint, bound and integrality requirement and the claimed objective."""
    missing = [v.name for v in inst.variables if v.name not in values]
    obj = inst.evaluate_objective(values)
    if missing:
        return Verification(False, "missing_values", obj, math.inf, math.inf, math.inf)
    worst_c = 0.0
    for c in inst.constraints:
        lhs = math.fsum(a * values[n] for n, a in c.coeffs.items())
        if c.sense == "<=":
            viol = lhs - c.rhs
        elif c.sense == ">=":
            viol = c.rhs - lhs
        else:
            viol = abs(lhs - c.rhs)
        worst_c = max(worst_c, viol)
    worst_b = 0.0
    worst_i = 0.0
    for v in inst.variables:
        x = values[v.name]
        worst_b = max(worst_b, v.lb - x, (x - v.ub) if v.ub is not None else 0.0)
        if v.vtype != "continuous":
            worst_i = max(worst_i, abs(x - round(x)))
    # Scale feasibility by the row's magnitude so large data does not fail on float noise alone.
    if worst_c > tol.feasibility * (1.0 + _rhs_scale(inst)):
        return Verification(False, "constraint_violation", obj, worst_c, worst_b, worst_i)
    if worst_b > tol.feasibility:
        return Verification(False, "bound_violation", obj, worst_c, worst_b, worst_i)
    if worst_i > tol.integrality:
        return Verification(False, "integrality_violation", obj, worst_c, worst_b, worst_i)
    if claimed_objective is None or not objective_agrees(obj, claimed_objective, tol.objective_rel):
        return Verification(False, "objective_mismatch", obj, worst_c, worst_b, worst_i)
    return Verification(True, "ok", obj, worst_c, worst_b, worst_i)


def _rhs_scale(inst: Instance) -> float:
    return max((abs(c.rhs) for c in inst.constraints), default=0.0)


def should_cross_check(seed: int, fraction: float) -> bool:
    """Deterministic Bernoulli(fraction) draw keyed by the instance seed."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    h = int.from_bytes(hashlib.sha256(f"cross:{seed}".encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def cross_check(inst: Instance, first: SolveResult, tol: ToleranceConfig, time_limit_s: float) -> tuple[bool, str]:
    """Solve with the other solver and require an optimal status and an agreeing objective."""
    partner = other_solver(first.solver)
    if partner == "gurobi":
        from trex.ordata.solve import fits_gurobi_licence

        if not fits_gurobi_licence(inst):
            return True, "skipped: model exceeds the gurobipy licence"
        second = solve_gurobi(inst, time_limit_s)
    else:
        second = solve_highs(inst, time_limit_s)
    if not second.optimal or second.objective is None or first.objective is None:
        return False, f"{partner} status {second.status}"
    if not objective_agrees(first.objective, second.objective, tol.objective_rel):
        return False, f"{first.solver} {first.objective!r} vs {partner} {second.objective!r}"
    return True, f"{partner} agrees"

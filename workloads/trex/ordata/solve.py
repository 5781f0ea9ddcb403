"""Solve an :class:`~trex.ordata.ir.Instance` with gurobipy (when it fits the size-limited licence) or HiGHS.

Models are built directly from the IR (no files; :func:`write_model` exports one as LP or MPS). Both adapters return
the same :class:`SolveResult`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from trex.ordata.ir import Instance

SolverChoice = Literal["gurobi", "highs", "auto"]
Status = Literal["optimal", "infeasible", "unbounded", "inf_or_unbd", "time_limit", "error"]

# gurobipy's size-limited licence: at most this many variables and constraints (linear / quadratic models).
GUROBI_LIMIT_LINEAR = 2000
GUROBI_LIMIT_QUADRATIC = 200
MIP_GAP = 1e-9


@dataclass
class SolveResult:
    """Outcome of one solve."""

    status: Status
    objective: float | None
    values: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    solver: str = ""
    solver_version: str = ""
    message: str = ""

    @property
    def optimal(self) -> bool:
        """True when the solver proved optimality."""
        return self.status == "optimal"


def fits_gurobi_licence(inst: Instance) -> bool:
    """Whether the model stays within the size-limited gurobipy licence."""
    limit = GUROBI_LIMIT_QUADRATIC if inst.is_quadratic else GUROBI_LIMIT_LINEAR
    return len(inst.variables) <= limit and len(inst.constraints) <= limit


def pick_solver(inst: Instance, choice: SolverChoice) -> Literal["gurobi", "highs"]:
    """gurobi when asked (or auto) and the model fits the licence; highs otherwise."""
    if choice in ("gurobi", "auto") and fits_gurobi_licence(inst):
        return "gurobi"
    return "highs"


def other_solver(name: str) -> Literal["gurobi", "highs"]:
    """The cross-check partner of ``name``."""
    return "highs" if name == "gurobi" else "gurobi"


def solve(inst: Instance, solver: SolverChoice = "auto", time_limit_s: float = 30.0) -> SolveResult:
    """Solve ``inst`` with the chosen solver; never raises for solver failures (status ``error``)."""
    which = pick_solver(inst, solver)
    try:
        return solve_gurobi(inst, time_limit_s) if which == "gurobi" else solve_highs(inst, time_limit_s)
    except Exception as exc:  # a solver library failure becomes a rejected instance, not a crash
        return SolveResult("error", None, solver=which, message=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _gurobi_env() -> Any:
    import gurobipy as gp

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    return env


@lru_cache(maxsize=1)
def gurobi_version() -> str:
    """gurobipy's solver version as "major.minor.technical"."""
    import gurobipy as gp

    return ".".join(str(x) for x in gp.gurobi.version())


def solve_gurobi(inst: Instance, time_limit_s: float = 30.0) -> SolveResult:
    """Build and solve with gurobipy (raises ValueError when the model exceeds the licence)."""
    import gurobipy as gp
    from gurobipy import GRB

    if not fits_gurobi_licence(inst):
        raise ValueError(f"{inst.family}: model too large for the size-limited gurobipy licence")
    t0 = time.perf_counter()
    m = gp.Model(inst.family, env=_gurobi_env())
    try:
        m.Params.TimeLimit = time_limit_s
        m.Params.Threads = 1
        m.Params.MIPGap = MIP_GAP
        m.Params.MIPGapAbs = MIP_GAP
        vt = {"continuous": GRB.CONTINUOUS, "integer": GRB.INTEGER, "binary": GRB.BINARY}
        xs = {v.name: m.addVar(lb=v.lb, ub=GRB.INFINITY if v.ub is None else v.ub, vtype=vt[v.vtype], name=v.name)
              for v in inst.variables}
        for c in inst.constraints:
            expr = gp.LinExpr([float(a) for a in c.coeffs.values()], [xs[n] for n in c.coeffs])
            sense = {"<=": GRB.LESS_EQUAL, ">=": GRB.GREATER_EQUAL, "==": GRB.EQUAL}[c.sense]
            m.addLConstr(expr, sense, float(c.rhs), name=c.name)
        o = inst.objective
        obj: Any = gp.LinExpr([float(a) for a in o.linear.values()], [xs[n] for n in o.linear]) + o.constant
        if o.quadratic:
            q = gp.QuadExpr()
            q.addTerms([float(c) for _, _, c in o.quadratic], [xs[u] for u, _, _ in o.quadratic],
                       [xs[w] for _, w, _ in o.quadratic])
            obj = obj + q
        m.setObjective(obj, GRB.MINIMIZE if o.sense == "min" else GRB.MAXIMIZE)
        m.optimize()
        gurobi_status: dict[int, Status] = {
            GRB.OPTIMAL: "optimal", GRB.INFEASIBLE: "infeasible", GRB.UNBOUNDED: "unbounded",
            GRB.INF_OR_UNBD: "inf_or_unbd", GRB.TIME_LIMIT: "time_limit",
        }
        status: Status = gurobi_status.get(m.Status, "error")
        values: dict[str, float] = {}
        objective: float | None = None
        if status == "optimal" or (status == "time_limit" and m.SolCount > 0):
            objective = float(m.ObjVal)
            values = {n: float(x.X) for n, x in xs.items()}
        return SolveResult(status, objective, values, time.perf_counter() - t0, "gurobi", gurobi_version(),
                           message=f"gurobi status {m.Status}")
    finally:
        m.dispose()


# ---------------------------------------------------------------------------------------------------
def highs_version() -> str:
    """highspy's solver version."""
    import highspy

    return str(highspy.Highs().version())  # type: ignore[no-untyped-call]


def build_highs(inst: Instance, time_limit_s: float = 30.0) -> Any:
    """A silent ``highspy.Highs`` holding the model (columns and rows named as in the IR)."""
    import highspy
    import numpy as np

    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    # "threads" is left at its default: HiGHS's global scheduler refuses a different count once started.
    h.setOptionValue("mip_rel_gap", MIP_GAP)
    h.setOptionValue("mip_abs_gap", MIP_GAP)
    inf = highspy.kHighsInf
    idx = inst.var_index()
    n = len(inst.variables)
    o = inst.objective
    cost = np.zeros(n)
    for name, a in o.linear.items():
        cost[idx[name]] += a
    lower = np.array([v.lb for v in inst.variables], dtype=float)
    upper = np.array([inf if v.ub is None else v.ub for v in inst.variables], dtype=float)
    h.addCols(n, cost, lower, upper, 0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
    integ = [i for i, v in enumerate(inst.variables) if v.vtype != "continuous"]
    if integ:
        h.changeColsIntegrality(len(integ), np.array(integ, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * len(integ)))
    if inst.constraints:
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        lo: list[float] = []
        up: list[float] = []
        for c in inst.constraints:
            starts.append(len(index))
            for name, a in c.coeffs.items():
                index.append(idx[name])
                value.append(a)
            lo.append(c.rhs if c.sense in (">=", "==") else -inf)
            up.append(c.rhs if c.sense in ("<=", "==") else inf)
        h.addRows(len(inst.constraints), np.array(lo), np.array(up), len(index), np.array(starts, dtype=np.int32),
                  np.array(index, dtype=np.int32), np.array(value, dtype=float))
    for i, v in enumerate(inst.variables):
        h.passColName(i, v.name)
    for r, c in enumerate(inst.constraints):
        h.passRowName(r, c.name)
    if o.constant:
        h.changeObjectiveOffset(float(o.constant))
    if o.quadratic:
        if o.sense == "max":
            raise ValueError("quadratic objectives must be minimised (convex QP)")
        # HiGHS minimises c'x + 0.5 x'Qx with Q given as its lower triangle, column-wise.
        entries: dict[tuple[int, int], float] = {}
        for u, w, q in o.quadratic:
            i, j = idx[u], idx[w]
            r_, c_ = max(i, j), min(i, j)  # (row, col) in the lower triangle
            entries[(r_, c_)] = entries.get((r_, c_), 0.0) + (2.0 * q if i == j else q)
        hess = highspy.HighsHessian()
        hess.dim_ = n
        hess.format_ = highspy.HessianFormat.kTriangular
        start, hidx, hval = [0], [], []
        for col in range(n):
            for (r_, c_), val in sorted(entries.items()):
                if c_ == col:
                    hidx.append(r_)
                    hval.append(val)
            start.append(len(hidx))
        hess.start_ = start
        hess.index_ = hidx
        hess.value_ = hval
        h.passHessian(hess)
    h.changeObjectiveSense(highspy.ObjSense.kMinimize if o.sense == "min" else highspy.ObjSense.kMaximize)
    return h


def write_model(inst: Instance, path: str | Path) -> Path:
    """Write the model as LP or MPS (chosen by the suffix .lp / .mps) through HiGHS's writer."""
    p = Path(path)
    if p.suffix not in (".lp", ".mps"):
        raise ValueError(f"path suffix must be .lp or .mps, got {p.suffix!r}")
    h = build_highs(inst, time_limit_s=60.0)
    h.writeModel(str(p))
    return p


def solve_highs(inst: Instance, time_limit_s: float = 30.0) -> SolveResult:
    """Build and solve with highspy."""
    import highspy

    t0 = time.perf_counter()
    h = build_highs(inst, time_limit_s)
    h.run()
    ms = h.getModelStatus()
    S = highspy.HighsModelStatus
    highs_status: dict[Any, Status] = {
        S.kOptimal: "optimal", S.kInfeasible: "infeasible", S.kUnbounded: "unbounded",
        S.kUnboundedOrInfeasible: "inf_or_unbd", S.kTimeLimit: "time_limit",
    }
    status: Status = highs_status.get(ms, "error")
    values: dict[str, float] = {}
    objective: float | None = None
    if status == "optimal":
        col = list(h.getSolution().col_value)
        values = {v.name: float(col[i]) for i, v in enumerate(inst.variables)}
        objective = float(h.getInfo().objective_function_value)
        if not math.isfinite(objective):
            status, objective = "error", None
    return SolveResult(status, objective, values, time.perf_counter() - t0, "highs", str(h.version()),
                       message=h.modelStatusToString(ms))
